"""A distributional critic's support per member (hparams v_min and v_max, traced, so that PBT,
PB2 or MF-PBT tune it within one program) against the static support of the same values: the
projection, the losses, and a whole population's update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import population
from fastpop.agents import losses
from fastpop.config import ConfigError, load_config
from tests.helpers import TINY_OPTIONS, leaves_allclose, random_buffers, stacked_hparams, tiny_agent
from tests.test_population import PER_MEMBER, run_executor

# One member each: an asymmetric support and a wide symmetric one (each static support compiles
# a program of its own, at XLA's optimizations: two members keep the comparison and its cost low).
SUPPORTS = [(-50.0, 5.0), (-250.0, 250.0)]


@pytest.mark.parametrize("v_min, v_max, num_atoms", [(-10.0, 10.0, 51), (-1600.0, 0.0, 101),
                                                     (-3.7, 12.9, 11)])  # fmt: skip
def test_a_member_support_projects_as_the_static_support_of_its_values(v_min, v_max, num_atoms):
    static = np.linspace(v_min, v_max, num_atoms, dtype=np.float32)
    traced = jax.jit(lambda lo, hi: losses.member_support(lo, hi, num_atoms))(v_min, v_max)
    np.testing.assert_allclose(traced.atoms, static, rtol=0, atol=1e-6 * abs(v_max - v_min))
    assert traced.atoms[0] == static[0] and traced.atoms[-1] == static[-1]
    key = jax.random.key(0)
    probs = jax.nn.softmax(jax.random.normal(key, (num_atoms,)))
    for reward, bootstrap in [(0.0, 1.0), (1.5, 0.9), (-400.0, 0.99), (30.0, 0.0)]:
        want = losses.categorical_target(jnp.float32(reward), jnp.float32(bootstrap), probs, static)
        got = losses.categorical_target(jnp.float32(reward), jnp.float32(bootstrap), probs, traced)
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(jnp.sum(got), 1.0, rtol=1e-5)
    logits = jax.random.normal(jax.random.key(1), (2, num_atoms))
    np.testing.assert_allclose(
        losses.categorical_mean(logits, traced), losses.categorical_mean(logits, static),
        rtol=1e-5, atol=1e-5 * abs(v_max - v_min),
    )  # fmt: skip


@pytest.mark.optimized  # bit for bit across two programs
@pytest.mark.parametrize("name", ["td3", "sac"])
def test_members_own_supports_in_one_program_train_as_static_supports(name):
    """One vectorized update of two members with their own v_min and v_max (and n-step
    returns): member i's state after it equals member i's in a population whose agent.v_min /
    v_max are static at member i's values (same buffers, keys and other hparams)."""
    size, options = len(SUPPORTS), {**TINY_OPTIONS["distributional"], "n_step": 2}
    per_member = {hparam: values[:size] for hparam, values in PER_MEMBER[name].items()}
    spec, buffers = random_buffers(name, size)

    def trained(agent_support, member_supports):
        v_min, v_max = agent_support
        agent = tiny_agent(name, **{**options, "v_min": v_min, "v_max": v_max})
        ends = {}
        if member_supports is not None:
            ends = dict(zip(("v_min", "v_max"), zip(*member_supports, strict=True), strict=True))
        hparams = stacked_hparams(agent, size, **per_member, **ends)
        states = population.init_population(agent, jax.random.key(0), hparams)
        return run_executor("vectorized", agent, spec, buffers, hparams, states, calls=1)[0]

    traced = trained((-1.0, 1.0), SUPPORTS)  # the agent's own support unused
    statics = [trained(support, None) for support in SUPPORTS]  # one program each
    for member, static in enumerate(statics):
        got, want = population.member(traced, member), population.member(static, member)
        # the supports' spacings are float32 numbers: the same atoms, the same numbers
        assert jax.tree.all(jax.tree.map(np.array_equal, got, want))
    other = population.member(statics[1], 0)  # member 0 trained on member 1's support
    assert not leaves_allclose(population.member(traced, 0), other)


def test_a_member_support_needs_a_distributional_critic_and_room_below_v_max():
    with pytest.raises(ConfigError, match=r"population\.priors\.v_min: .*agent\.critic: distrib"):
        load_config(None, ["population.size=4", "population.priors={v_min: {uniform: [-9, -1]}}"])
    distributional = ["agent.critic=distributional", "agent.v_min=-100", "agent.v_max=0"]
    with pytest.raises(ConfigError, match=r"population\.priors\.v_min: lets v_min .* reach 5\.0"):
        load_config(None, [*distributional, "population.size=4",
                           "population.priors={v_min: {uniform: [-200, 5]}}"])  # fmt: skip
    config = load_config(None, [*distributional, "hparams.v_max=50"])
    assert config.hparams["v_max"] == 50.0 and config.hparams["v_min"] is None

"""The collector's numpy policy against the agents' jitted `act` on the same params, obs and key."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fastpop import population
from fastpop.agents import make_agent
from fastpop.collect.acting import JaxActing, NumpyActing, make_acting
from fastpop.types import EnvSpec

SPEC = EnvSpec(obs_shape=(5,), action_dim=3, action_low=-2.0, action_high=1.0)
MEMBERS, ENVS_PER_MEMBER = 3, 2
SLOT_MEMBERS = np.array([0, 1, 1, 2])  # a collector's block of slots 1..4
STEPS, BLOCK = 8, 3  # the noise is drawn in blocks of 3 steps: 8 steps cross two boundaries


def _slot_policy(algo: str):
    agent = make_agent(algo, SPEC, hidden_sizes=(16, 16))
    noise = {"exploration_noise": [0.1, 0.4, 0.9]} if algo == "td3" else {}
    hparams = population.broadcast_hparams(agent.default_hparams(), MEMBERS, **noise)
    states = population.init_population(agent, jax.random.key(3), hparams)
    policy = population.member_policies(agent, states)
    gather = jax.tree.map(lambda leaf: np.asarray(leaf)[SLOT_MEMBERS], (policy, hparams))
    return agent, *gather


def _observations(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # float64, as MuJoCo returns them; large enough to saturate
    return [3.0 * rng.standard_normal((len(SLOT_MEMBERS), 5)) for _ in range(steps)]


def _actions(acting, policy, hparams, observations) -> np.ndarray:
    acting.set_policy(policy, hparams)
    return np.stack([acting(obs, step) for step, obs in enumerate(observations)])


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_acts_as_the_jitted_agent_with_the_same_noise(algo):
    agent, policy, hparams = _slot_policy(algo)
    observations = _observations(STEPS)
    key = jax.random.key(11)
    slots = len(SLOT_MEMBERS)
    jitted = _actions(JaxActing(agent, slots, ENVS_PER_MEMBER, key), policy, hparams, observations)
    numpy = _actions(NumpyActing(algo, SPEC, slots, key, BLOCK), policy, hparams, observations)
    assert numpy.shape == jitted.shape == (STEPS, slots, 3) and numpy.dtype == np.float32
    np.testing.assert_allclose(numpy, jitted, rtol=1e-5, atol=1e-5)
    assert np.all((numpy >= -2.0) & (numpy <= 1.0))
    # Exploration is on: repeating an observation does not repeat the action.
    repeated = _actions(
        NumpyActing(algo, SPEC, slots, key, BLOCK), policy, hparams, [observations[0]] * 2
    )
    assert not np.allclose(repeated[0], repeated[1])


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_noise_is_seeded_by_the_key(algo):
    _, policy, hparams = _slot_policy(algo)
    observations = _observations(STEPS)
    slots = len(SLOT_MEMBERS)

    def run(seed: int) -> np.ndarray:
        acting = NumpyActing(algo, SPEC, slots, jax.random.key(seed), BLOCK)
        return _actions(acting, policy, hparams, observations)

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.allclose(run(5), run(6))


def test_td3_noise_scales_with_each_slots_exploration_noise():
    _, policy, hparams = _slot_policy("td3")
    obs = _observations(1)[0] * 0.01  # far from the action bounds: no clipping
    quiet = hparams._replace(exploration_noise=np.zeros_like(hparams.exploration_noise))
    key = jax.random.key(2)
    deterministic = _actions(NumpyActing("td3", SPEC, 4, key, BLOCK), policy, quiet, [obs])[0]
    noisy = _actions(NumpyActing("td3", SPEC, 4, key, BLOCK), policy, hparams, [obs])[0]
    normal = np.asarray(NumpyActing("td3", SPEC, 4, key, BLOCK)._next_normals())
    half_range = 1.5
    expected = deterministic + (hparams.exploration_noise * half_range)[:, None] * normal
    np.testing.assert_allclose(noisy, np.clip(expected, -2.0, 1.0), rtol=1e-5, atol=1e-6)


def test_other_agents_image_observations_and_large_slot_sets_keep_the_jitted_policy():
    key = jax.random.key(0)
    td3 = make_agent("td3", SPEC, hidden_sizes=(8,))
    assert isinstance(make_acting("td3", td3, SPEC, 2, 1, key), NumpyActing)
    wide = make_agent("td3", SPEC, hidden_sizes=(256, 256))  # 272 KiB of actor weights
    assert isinstance(make_acting("td3", wide, SPEC, 7, 1, key), NumpyActing)
    assert isinstance(make_acting("td3", wide, SPEC, 8, 1, key), JaxActing)  # out of cache
    discrete = EnvSpec(obs_shape=(4,), num_actions=2)
    dqn = make_agent("dqn", discrete, hidden_sizes=(8,))
    assert isinstance(make_acting("dqn", dqn, discrete, 2, 1, key), JaxActing)
    with pytest.raises(ValueError, match="no numpy policy"):
        NumpyActing("td3", EnvSpec(obs_shape=(8, 8, 3), action_dim=2), 2, key)

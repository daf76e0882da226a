"""The collector's numpy policy against the agents' jitted `act` on the same params, obs and
normals, built as a collector builds it: from the published leaves and their key paths."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fastpop import population
from fastpop.agents import make_agent
from fastpop.collect import numpy_policy
from fastpop.collect.acting import JaxActing, numpy_policy_for
from fastpop.collect.collector import policy_template
from fastpop.collect.numpy_policy import NumpyActing
from fastpop.types import EnvSpec

SPEC = EnvSpec(obs_shape=(5,), action_dim=3, action_low=-2.0, action_high=1.0)
MEMBERS, ENVS_PER_MEMBER = 3, 2
SLOT_MEMBERS = np.array([0, 1, 1, 2])  # a collector's block of slots 1..4
STEPS = 8


def _published(algo: str):
    """(agent, the learner's published tree as host arrays: stacked policies, hparams, steps)."""
    agent = make_agent(algo, SPEC, hidden_sizes=(16, 16))
    noise = {"exploration_noise": [0.1, 0.4, 0.9]} if algo == "td3" else {}
    hparams = population.broadcast_hparams(agent.default_hparams(), MEMBERS, **noise)
    states = population.init_population(agent, jax.random.key(3), hparams)
    policy = population.member_policies(agent, states)
    return agent, jax.tree.map(np.asarray, (policy, hparams, np.int32(0)))


def _numpy_acting(algo: str, published, normals) -> NumpyActing:
    """A collector's numpy acting for SLOT_MEMBERS, its policy loaded from the leaves."""
    plan = numpy_policy_for(algo, SPEC, published, len(SLOT_MEMBERS))
    acting = NumpyActing(plan, normals)
    acting.set_policy(*numpy_policy.slots_policy(plan, SLOT_MEMBERS)(jax.tree.leaves(published)))
    return acting


def _jax_normals(key):
    """The standard normals the agents' `act` draws per step under JaxActing's key chain: per
    step `key, act_key = split(key)`, one key per slot from `split(act_key, slots)`."""
    state = {"key": key}

    def draw() -> np.ndarray:
        state["key"], act_key = jax.random.split(state["key"])
        keys = jax.random.split(act_key, len(SLOT_MEMBERS))
        normal = jax.vmap(lambda k: jax.random.normal(k, (1, SPEC.action_dim))[0])(keys)
        return np.asarray(normal)

    return draw


def _observations(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # float64, as MuJoCo returns them; large enough to saturate
    return [3.0 * rng.standard_normal((len(SLOT_MEMBERS), 5)) for _ in range(steps)]


def _actions(acting, observations) -> np.ndarray:
    return np.stack([acting(obs, step) for step, obs in enumerate(observations)])


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_acts_as_the_jitted_agent_given_the_same_normals(algo):
    agent, published = _published(algo)
    observations = _observations(STEPS)
    key, slots = jax.random.key(11), len(SLOT_MEMBERS)
    jitted = JaxActing(agent, slots, ENVS_PER_MEMBER, key)
    jitted.set_policy(*jax.tree.map(lambda leaf: leaf[SLOT_MEMBERS], published[:2]))
    numpy = _actions(_numpy_acting(algo, published, _jax_normals(key)), observations)
    assert numpy.shape == (STEPS, slots, 3) and numpy.dtype == np.float32
    np.testing.assert_allclose(numpy, _actions(jitted, observations), rtol=1e-5, atol=1e-5)
    assert np.all((numpy >= -2.0) & (numpy <= 1.0))


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_noise_is_numpys_seeded_by_the_collectors_env_seed(algo):
    _, published = _published(algo)
    observations = _observations(STEPS)

    def run(seed: int, observations=observations) -> np.ndarray:
        normals = numpy_policy.standard_normals(seed, (len(SLOT_MEMBERS), SPEC.action_dim))
        return _actions(_numpy_acting(algo, published, normals), observations)

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.allclose(run(5), run(6))
    repeated = run(5, [observations[0]] * 2)  # exploring: the same observation, new actions
    assert not np.allclose(repeated[0], repeated[1])
    normals = numpy_policy.standard_normals(0, (10_000, 3))()
    assert abs(normals.mean()) < 0.02 and abs(normals.std() - 1.0) < 0.02


def test_td3_noise_scales_with_each_slots_exploration_noise():
    _, published = _published("td3")
    policy, hparams, steps = published
    obs = _observations(1)[0] * 0.01  # far from the action bounds: no clipping
    normal = np.random.default_rng(4).standard_normal((len(SLOT_MEMBERS), 3), dtype=np.float32)
    quiet = (policy, hparams._replace(exploration_noise=np.zeros(MEMBERS, np.float32)), steps)
    deterministic = _actions(_numpy_acting("td3", quiet, lambda: normal), [obs])[0]
    noisy = _actions(_numpy_acting("td3", published, lambda: normal), [obs])[0]
    half_range = 1.5
    slot_noise = hparams.exploration_noise[SLOT_MEMBERS]
    expected = deterministic + (slot_noise * half_range)[:, None] * normal
    np.testing.assert_allclose(noisy, np.clip(expected, -2.0, 1.0), rtol=1e-5, atol=1e-6)


def test_other_agents_image_observations_and_large_slot_sets_keep_the_jitted_policy():
    def plan(algo, spec, slots, hidden_sizes=(8,)):
        agent = make_agent(algo, spec, hidden_sizes=hidden_sizes)
        return numpy_policy_for(algo, spec, policy_template(agent, 2), slots)

    assert plan("td3", SPEC, 2).leaf_paths[0][:3] == (0, "params", "MLP_0")
    assert (1, "exploration_noise") in plan("td3", SPEC, 2).leaf_paths
    wide = (256, 256)  # 272 KiB of actor weights per member
    assert plan("td3", SPEC, 7, wide) is not None
    assert plan("td3", SPEC, 8, wide) is None  # out of cache
    assert plan("dqn", EnvSpec(obs_shape=(4,), num_actions=2), 2) is None
    images = EnvSpec(obs_shape=(8, 8, 3), action_dim=3)
    template = policy_template(make_agent("td3", SPEC, hidden_sizes=(8,)), 2)
    assert numpy_policy_for("td3", images, template, 2) is None
    # An actor with a layer NumpyActing does not compute keeps the jitted policy.
    template = policy_template(make_agent("td3", SPEC, hidden_sizes=(8,)), 2)
    params = template[0]["params"]
    normed = {"params": {**params, "MLP_0": {**params["MLP_0"], "LayerNorm_0": {"scale": 0}}}}
    assert numpy_policy_for("td3", SPEC, (normed, *template[1:]), 2) is None
    with pytest.raises(ValueError, match="no numpy policy for dqn"):
        NumpyActing(plan("td3", SPEC, 2)._replace(algo="dqn"), lambda: None)

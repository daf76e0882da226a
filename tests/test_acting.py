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
DISCRETE = EnvSpec(obs_shape=(5,), num_actions=4)
MEMBERS, ENVS_PER_MEMBER = 3, 2
SLOT_MEMBERS = np.array([0, 1, 1, 2])  # a collector's block of slots 1..4
STEPS = 8


def _published(algo: str, observation_norm: bool = False, agent_fields=(), **per_member):
    """(agent, the learner's published tree as host arrays: stacked policies, hparams, steps).
    With `observation_norm`, each member's statistics are its own, some features clipping;
    `agent_fields`: other fields of the algo's config."""
    spec = DISCRETE if algo == "dqn" else SPEC
    fields = {"observation_norm": observation_norm, **dict(agent_fields)}
    agent = make_agent(algo, spec, hidden_sizes=(16, 16), **fields)
    if algo == "td3":
        per_member = {"exploration_noise": [0.1, 0.4, 0.9], **per_member}
    hparams = population.broadcast_hparams(agent.default_hparams(), MEMBERS, **per_member)
    states = population.init_population(agent, jax.random.key(3), hparams)
    if observation_norm:
        rng = np.random.default_rng(1)
        mean = rng.normal(size=(MEMBERS, 5)).astype(np.float32)
        var = rng.uniform(0.05, 4.0, (MEMBERS, 5)).astype(np.float32)
        stats = states.observation_norm._replace(mean=mean, var=var)
        states = states._replace(observation_norm=stats)
    policy = population.member_policies(agent, states)
    return agent, jax.tree.map(np.asarray, (policy, hparams, np.int32(0)))


def _numpy_acting(algo: str, published, rng) -> NumpyActing:
    """A collector's numpy acting for SLOT_MEMBERS, its policy loaded from the leaves."""
    spec = DISCRETE if algo == "dqn" else SPEC
    plan = numpy_policy_for(algo, spec, published, len(SLOT_MEMBERS), ENVS_PER_MEMBER)
    acting = NumpyActing(plan, rng)
    acting.set_policy(*numpy_policy.slots_policy(plan, SLOT_MEMBERS)(jax.tree.leaves(published)))
    return acting


class JaxNormals:
    """In place of the numpy generator: the standard normals TD3's and SAC's `act` draw per
    step under JaxActing's key chain (per step `key, act_key = split(key)`, one key per slot
    from `split(act_key, slots)`)."""

    def __init__(self, key):
        self.key = key

    def standard_normal(self, shape, dtype):
        self.key, act_key = jax.random.split(self.key)
        keys = jax.random.split(act_key, shape[0])
        normal = jax.vmap(lambda k: jax.random.normal(k, (1, shape[1]))[0])(keys)
        return np.asarray(normal, dtype)


def _observations(steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # float64, as MuJoCo returns them; large enough to saturate
    return [3.0 * rng.standard_normal((len(SLOT_MEMBERS), 5)) for _ in range(steps)]


def _actions(acting, observations) -> np.ndarray:
    return np.stack([acting(obs, step) for step, obs in enumerate(observations)])


def _jax_actions(agent, published, observations, key) -> np.ndarray:
    jitted = JaxActing(agent, len(SLOT_MEMBERS), ENVS_PER_MEMBER, key)
    jitted.set_policy(*jax.tree.map(lambda leaf: leaf[SLOT_MEMBERS], published[:2]))
    return _actions(jitted, observations)


@pytest.mark.parametrize("observation_norm", [False, True], ids=["raw", "observation_norm"])
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_acts_as_the_jitted_agent_given_the_same_normals(algo, observation_norm):
    agent, published = _published(algo, observation_norm)
    observations, key = _observations(STEPS), jax.random.key(11)
    numpy = _actions(_numpy_acting(algo, published, JaxNormals(key)), observations)
    assert numpy.shape == (STEPS, len(SLOT_MEMBERS), 3) and numpy.dtype == np.float32
    jitted = _jax_actions(agent, published, observations, key)
    np.testing.assert_allclose(numpy, jitted, rtol=1e-5, atol=1e-5)
    assert np.all((numpy >= -2.0) & (numpy <= 1.0))


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_numpy_policy_noise_is_numpys_seeded_by_the_collectors_env_seed(algo):
    _, published = _published(algo)
    observations = _observations(STEPS)

    def run(seed: int, observations=observations) -> np.ndarray:
        rng = numpy_policy.exploration_generator(seed)
        return _actions(_numpy_acting(algo, published, rng), observations)

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.allclose(run(5), run(6))
    repeated = run(5, [observations[0]] * 2)  # exploring: the same observation, new actions
    assert not np.allclose(repeated[0], repeated[1])
    normals = numpy_policy.exploration_generator(0).standard_normal(30_000, dtype=np.float32)
    assert abs(normals.mean()) < 0.02 and abs(normals.std() - 1.0) < 0.02


def test_td3_noise_scales_with_each_slots_exploration_noise():
    _, published = _published("td3")
    policy, hparams, steps = published
    obs = _observations(1)[0] * 0.01  # far from the action bounds: no clipping
    normal = np.random.default_rng(4).standard_normal((len(SLOT_MEMBERS), 3), dtype=np.float32)
    quiet = (policy, hparams._replace(exploration_noise=np.zeros(MEMBERS, np.float32)), steps)
    deterministic = _actions(_numpy_acting("td3", quiet, np.random.default_rng(4)), [obs])[0]
    noisy = _actions(_numpy_acting("td3", published, np.random.default_rng(4)), [obs])[0]
    half_range = 1.5
    slot_noise = hparams.exploration_noise[SLOT_MEMBERS]
    expected = deterministic + (slot_noise * half_range)[:, None] * normal
    np.testing.assert_allclose(noisy, np.clip(expected, -2.0, 1.0), rtol=1e-5, atol=1e-6)


def test_image_observations_convolutions_and_large_slot_sets_keep_the_jitted_policy():
    def template_of(agent):
        return policy_template(agent, population.broadcast_hparams(agent.default_hparams(), 2))

    def plan(algo, spec, slots, hidden_sizes=(8,)):
        agent = make_agent(algo, spec, hidden_sizes=hidden_sizes)
        return numpy_policy_for(algo, spec, template_of(agent), slots, ENVS_PER_MEMBER)

    assert plan("td3", SPEC, 2).leaf_paths[0][:3] == (0, "params", "MLP_0")
    assert (1, "exploration_noise") in plan("td3", SPEC, 2).leaf_paths
    assert plan("dqn", DISCRETE, 2).envs_per_member == ENVS_PER_MEMBER
    wide = (256, 256)  # 272 KiB of actor weights per member
    assert plan("td3", SPEC, 7, wide) is not None
    assert plan("td3", SPEC, 8, wide) is None  # out of cache
    assert plan("dqn", EnvSpec(obs_shape=(84, 84, 4), obs_dtype=np.uint8, num_actions=6), 2) is None
    images = EnvSpec(obs_shape=(8, 8, 3), action_dim=3)
    template = template_of(make_agent("td3", SPEC, hidden_sizes=(8,)))
    assert numpy_policy_for("td3", images, template, 2, 1) is None
    # An actor with a layer NumpyActing does not compute keeps the jitted policy.
    params = template[0]["params"]
    normed = {"params": {**params, "MLP_0": {**params["MLP_0"], "LayerNorm_0": {"scale": 0}}}}
    assert numpy_policy_for("td3", SPEC, (normed, *template[1:]), 2, 1) is None
    with pytest.raises(ValueError, match="no numpy policy for ppo"):
        NumpyActing(plan("td3", SPEC, 2)._replace(kind="ppo"), np.random.default_rng(0))


def test_dqn_acts_greedily_as_the_jitted_agent_and_explores_at_its_epsilon():
    """Greedy actions equal the jitted agent's (epsilon 0; float and uint8 observations, which
    the network scales to [0, 1]); with epsilon decaying from 1 to 0
    over 100 env steps per member, a slot 25 steps in (50 of its member's: 2 envs per member)
    acts at random half the time, a uniform action: 3 in 8 actions differ from the greedy."""
    greedy = {"epsilon_start": [0.0] * MEMBERS, "epsilon_end": [0.0] * MEMBERS}
    agent, published = _published("dqn", **greedy)
    observations = _observations(STEPS)
    numpy = _actions(_numpy_acting("dqn", published, np.random.default_rng(0)), observations)
    assert numpy.dtype == np.int32
    jitted = _jax_actions(agent, published, observations, jax.random.key(0))
    np.testing.assert_array_equal(numpy, jitted)
    # Biases away from their zero init: the scaling then changes which action is greedy.
    rng = np.random.default_rng(2)
    biased = jax.tree_util.tree_map_with_path(
        lambda path, leaf: (
            leaf + rng.normal(size=leaf.shape).astype(leaf.dtype)
            if path[-1].key == "bias"
            else leaf
        ),
        published[0],
    )
    published = (biased, *published[1:])
    ram = [np.random.default_rng(step).integers(0, 256, (4, 5), np.uint8) for step in range(8)]
    numpy_ram = _actions(_numpy_acting("dqn", published, np.random.default_rng(0)), ram)
    np.testing.assert_array_equal(numpy_ram, _jax_actions(agent, published, ram, jax.random.key(0)))
    decaying = {"epsilon_start": [1.0] * MEMBERS, "epsilon_end": [0.0] * MEMBERS}
    _, published = _published("dqn", **decaying, epsilon_decay_steps=[100] * MEMBERS)
    acting = _numpy_acting("dqn", published, np.random.default_rng(1))
    many = _observations(1)[0]
    taken = np.stack([acting(many, 25) for _ in range(2_000)])
    assert 0.33 < np.mean(taken != numpy[0]) < 0.42
    assert set(np.unique(taken)) == {0, 1, 2, 3}
    assert np.all(np.stack([acting(many, 50) for _ in range(50)]) == numpy[0])  # epsilon 0


def test_a_dueling_dqn_acts_greedily_as_the_jitted_agent():
    """The numpy policy takes the argmax of the advantage stream (Dense_0), which is Q's: the
    value stream and the mean advantage add the same to every action."""
    greedy = {"epsilon_start": [0.0] * MEMBERS, "epsilon_end": [0.0] * MEMBERS}
    agent, published = _published("dqn", agent_fields={"dueling": True}, **greedy)
    heads = published[0]["params"]
    assert heads["Dense_0"]["kernel"].shape[-1] == 4 and heads["Dense_1"]["kernel"].shape[-1] == 1
    rng = np.random.default_rng(3)  # biases away from zero, the value's too
    biased = jax.tree.map(lambda leaf: leaf + rng.normal(size=leaf.shape).astype(leaf.dtype), heads)
    published = ({"params": biased}, *published[1:])
    acting = _numpy_acting("dqn", published, np.random.default_rng(0))
    observations = _observations(STEPS)
    numpy = _actions(acting, observations)
    jitted = _jax_actions(agent, published, observations, jax.random.key(0))
    np.testing.assert_array_equal(numpy, jitted)
    assert len(np.unique(numpy)) > 1  # the observations exercise more than one action

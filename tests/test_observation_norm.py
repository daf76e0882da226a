"""`agent.observation_norm`: each member's running mean and variance of the observations it
learns from (numpy's over everything it has seen), its networks trained on normalized batches,
and the same normalization from the same numbers wherever its published policy acts: the agent's
`act`, a collector's numpy policy and `fastpop export`'s function; kept in checkpoints (a device
run stopped and resumed equals an uninterrupted one); refused for images and shared critics."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.agents import make_agent
from fastpop.agents.observation_norm import ObservationStats, initial_stats, merged
from fastpop.collect import numpy_policy
from fastpop.collect.acting import numpy_policy_for
from fastpop.collect.numpy_policy import NumpyActing
from fastpop.commands import cli, evaluate, export
from fastpop.config.build import build_agent, build_env_spec
from fastpop.run.parts import build_run
from fastpop.schema import ConfigError
from fastpop.types import EnvSpec, Transition
from tests.helpers import refused_train
from tests.runs import REPO

CONTINUOUS = EnvSpec(obs_shape=(5,), action_dim=3, action_low=-2.0, action_high=1.0)
DISCRETE = EnvSpec(obs_shape=(5,), num_actions=4)
SPECS = {"td3": CONTINUOUS, "sac": CONTINUOUS, "dqn": DISCRETE}
BATCH = 8
# hparams whose explore=False action is what a collector's numpy policy takes without noise
QUIET = {"td3": {"exploration_noise": 0.0}, "sac": {}, "dqn": {"epsilon_start": 0.0}}


def tiny(algo: str, observation_norm: bool = True):
    return make_agent(
        algo,
        SPECS[algo],
        hidden_sizes=(16, 16),
        batch_size=BATCH,
        observation_norm=observation_norm,
    )


def batch(algo: str, seed: int, loc: float = 0.0, scale: float = 1.0) -> Transition:
    """A batch of transitions whose observations have their own mean and spread per feature."""
    rng = np.random.default_rng(seed)
    obs = lambda: (loc + scale * rng.standard_normal((BATCH, 5)) * np.arange(1, 6)).astype(
        np.float32
    )
    if algo == "dqn":
        action = rng.integers(0, 4, BATCH).astype(np.int32)
    else:
        action = rng.uniform(-2.0, 1.0, (BATCH, 3)).astype(np.float32)
    reward = rng.standard_normal(BATCH).astype(np.float32)
    flags = np.zeros(BATCH, bool)
    return Transition(obs(), action, reward, obs(), flags, flags)


def test_merging_batches_gives_the_mean_and_variance_of_all_of_them():
    """By hand: {1, 3} then {5, 7} is {1, 3, 5, 7}: mean 4, variance (9 + 1 + 1 + 9) / 4 = 5."""
    stats = initial_stats(EnvSpec(obs_shape=(1,), action_dim=1))
    stats = merged(stats, jnp.array([[1.0], [3.0]]))
    assert (stats.mean.tolist(), stats.var.tolist(), stats.count.item()) == ([2.0], [1.0], 2.0)
    stats = merged(stats, jnp.array([[5.0], [7.0]]))
    assert (stats.mean.tolist(), stats.var.tolist(), stats.count.item()) == ([4.0], [5.0], 4.0)


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_the_running_statistics_are_numpys_over_every_observation_sampled(algo):
    agent = tiny(algo)
    state = agent.init(jax.random.key(0), agent.default_hparams())
    assert state.observation_norm.count == 0
    update, seen = jax.jit(agent.update), []
    for step, (loc, scale) in enumerate([(10.0, 3.0), (-4.0, 0.5), (0.0, 1.0), (2.0, 8.0)]):
        sampled = batch(algo, step, loc, scale)
        state, _ = update(state, sampled, agent.default_hparams(), jax.random.key(step))
        seen.append(sampled.obs)  # the batch's obs; its next_obs are normalized, not counted
    seen = np.concatenate(seen).astype(np.float64)
    stats = state.observation_norm
    assert stats.count == len(seen) == 4 * BATCH
    np.testing.assert_allclose(stats.mean, seen.mean(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.var, seen.var(axis=0), rtol=1e-5)


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_the_update_trains_the_networks_on_normalized_batches(algo):
    """The normalizing agent's update is the plain agent's on the batch normalized (numpy's
    formula) by the statistics that include it; off, the state has no statistics at all."""
    normed, plain = tiny(algo), tiny(algo, observation_norm=False)
    hparams, key = plain.default_hparams(), jax.random.key(7)
    state = plain.init(jax.random.key(0), hparams)
    assert state.observation_norm is None
    sampled = batch(algo, 1, 3.0, 2.0)
    stats = ObservationStats(np.ones(5, np.float32), np.full(5, 4.0, np.float32), np.float32(16))
    after, _ = normed.update(state._replace(observation_norm=stats), sampled, hparams, key)
    # 16 observations of mean 1 and variance 4 seen before: 8 of -1 and 8 of 3
    obs = np.concatenate([np.full((8, 5), -1.0), np.full((8, 5), 3.0), sampled.obs])
    np.testing.assert_allclose(after.observation_norm.mean, obs.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(after.observation_norm.var, obs.var(axis=0), rtol=1e-5)
    mean, var = np.asarray(after.observation_norm.mean), np.asarray(after.observation_norm.var)
    scale = lambda x: np.clip((x - mean) / np.sqrt(var + np.float32(1e-8)), -10, 10)
    normalized = sampled._replace(obs=scale(sampled.obs), next_obs=scale(sampled.next_obs))
    expected, _ = plain.update(state, normalized, hparams, key)
    for want, got in zip(
        jax.tree.leaves(expected),
        jax.tree.leaves(after._replace(observation_norm=None)),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class ZeroNormals:
    """In place of a collector's numpy generator: no exploration noise (SAC's numpy policy
    then takes its deterministic action, tanh of the mean); DQN's draws, at epsilon 0, never
    take a random action."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.integers, self.random = self.rng.integers, self.rng.random

    def standard_normal(self, shape, dtype):
        return np.zeros(shape, dtype)


def numpy_actions(algo: str, spec: EnvSpec, published, obs: np.ndarray) -> np.ndarray:
    """A collector's numpy policy, one slot per member, built from the published leaves as a
    collector builds it: (steps, members, ...) actions for obs (steps, members, obs_dim)."""
    members = obs.shape[1]
    plan = numpy_policy_for(algo, spec, published, members, 1)
    assert plan is not None, "the collector would act with the jitted policy"
    acting = NumpyActing(plan, ZeroNormals())
    acting.set_policy(
        *numpy_policy.slots_policy(plan, np.arange(members))(jax.tree.leaves(published))
    )
    return np.stack([acting(step_obs, 0) for step_obs in obs])


def exported_actions(agent, spec: EnvSpec, policy, hparams, obs: np.ndarray) -> tuple:
    """What `fastpop export` writes for one member, loaded as its docs say: (actions, weights)."""
    weights, function = export.export_policy(agent, policy, hparams, spec)
    exported = jax.export.deserialize(bytearray(function))
    return np.asarray(exported.call(weights, obs)), weights


def assert_same_actions(algo, expected, *others):
    for actions in others:
        if algo == "dqn":
            np.testing.assert_array_equal(actions, expected)
        else:
            np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_act_the_numpy_collector_policy_and_export_take_the_same_actions(algo):
    agent, spec, members = tiny(algo), SPECS[algo], 3
    hparams = population.broadcast_hparams(agent.default_hparams(), members, **{
        name: [value] * members for name, value in QUIET[algo].items()
    })  # fmt: skip
    states = population.init_population(agent, jax.random.key(1), hparams)
    rng = np.random.default_rng(0)
    mean = rng.normal(size=(members, 5)).astype(np.float32)
    var = rng.uniform(0.05, 4.0, (members, 5)).astype(np.float32)  # some features clip at 10
    states = states._replace(observation_norm=ObservationStats(mean, var, np.full(members, 9.0)))
    policy = population.member_policies(agent, states)
    published = jax.tree.map(np.asarray, (policy, hparams, np.int32(0)))
    obs = (3.0 * rng.standard_normal((32, members, 5))).astype(np.float32)
    collected = numpy_actions(algo, spec, published, obs)
    for member in range(members):
        member_policy, member_hparams = population.member(published[:2], member)
        acted = agent.act(member_policy, obs[:, member], jax.random.key(3), member_hparams, False)
        exported, weights = exported_actions(
            agent, spec, member_policy, member_hparams, obs[:, member]
        )
        assert_same_actions(algo, np.asarray(acted), collected[:, member], exported)
        np.testing.assert_array_equal(weights["observation_norm/mean"], mean[member])
        np.testing.assert_array_equal(weights["observation_norm/var"], var[member])
    plain = tiny(algo, observation_norm=False)  # the statistics change the actions
    plain_policy = jax.tree.map(lambda x: x[0], population.member_policies(plain, states))
    unnormalized = plain.act(
        plain_policy, obs[:, 0], jax.random.key(3), jax.tree.map(lambda x: x[0], hparams), False
    )
    assert not np.allclose(unnormalized, collected[:, 0])


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_off_the_state_and_the_published_policy_are_the_networks_alone(algo):
    agent = tiny(algo, observation_norm=False)
    state = agent.init(jax.random.key(0), agent.default_hparams())
    assert state.observation_norm is None and list(agent.policy_params(state)) == ["params"]


# --- a run: checkpointed, resumed, evaluated and exported ---


def test_a_device_run_resumes_exactly_and_its_checkpoint_acts_alike_everywhere(tmp_path, capsys):
    """gymnax's Pendulum on the device with the option on: stopped and resumed equals
    uninterrupted (the statistics are in the checkpoint), and the checkpoint's member acts alike
    through `act`, a collector's numpy policy and `fastpop export`; `fastpop eval` runs it."""
    from fastpop.run.resume import resume_run
    from tests.test_device_mode import rows, run

    norm = "agent.observation_norm=true"
    whole = run(tmp_path, "whole", norm, "train.total_env_steps=1024")
    first = run(tmp_path, "resumed", norm, "train.total_env_steps=512")
    resume_run(first, ["train.total_env_steps=1024"], log=lambda message: None).run()
    assert len(rows(whole)) == 2 * 2 and rows(first) == rows(whole)
    loaded = evaluate.load_latest(whole, print)
    stats = loaded.policy["observation_norm"]
    assert stats["mean"].shape == (2, 3) and not np.allclose(stats["var"], 1.0)  # learned
    assert cli.main(["eval", str(whole), "--member", "1", "--episodes", "1"]) == 0
    out = tmp_path / "exported"
    assert cli.main(["export", str(whole), "--member", "1", "--out", str(out)]) == 0
    description = json.loads((out / "policy.json").read_text())
    assert description["observation_norm"]["mean"] == "observation_norm/mean"
    exported = jax.export.deserialize(bytearray((out / "policy.jax").read_bytes()))
    with np.load(out / "weights.npz", allow_pickle=False) as data:
        weights = dict(data)
    np.testing.assert_array_equal(weights["observation_norm/var"], stats["var"][1])
    spec = build_env_spec(loaded.config)
    obs = (2.0 * np.random.default_rng(0).standard_normal((16, 2, 3))).astype(np.float32)
    quiet = loaded.hparams._replace(exploration_noise=np.zeros(2, np.float32))
    published = jax.tree.map(np.asarray, (loaded.policy, quiet, np.int32(0)))
    collected = numpy_actions("td3", spec, published, obs)[:, 1]
    member_policy, member_hparams = jax.tree.map(lambda x: x[1], published[:2])
    acted = loaded.agent.act(member_policy, obs[:, 1], jax.random.key(0), member_hparams, False)
    assert_same_actions(
        "td3", np.asarray(acted), collected, np.asarray(exported.call(weights, obs[:, 1]))
    )


# --- the config ---


@pytest.mark.parametrize(
    "preset", ["td3_pendulum_cpu.yaml", "sac_pendulum_cpu.yaml", "dqn_cartpole_cpu.yaml"]
)
def test_the_option_is_accepted_off_by_default_and_saved(tmp_path, preset):
    path = REPO / "configs" / preset
    assert config_lib.load_config(path).agent["observation_norm"] is False
    config = config_lib.load_config(path, ["agent.observation_norm=true"])
    assert config.agent["observation_norm"] is True
    config_lib.save_config(config, tmp_path / "config.yaml")
    assert config_lib.load_config(tmp_path / "config.yaml") == config
    assert build_agent(config).policy_params is not None


def test_image_observations_and_shared_critics_are_refused_naming_the_field(tmp_path, capsys):
    error = refused_train(
        tmp_path, capsys, REPO / "configs" / "dqn_pong.yaml", "agent.observation_norm=true"
    )
    assert "agent.observation_norm normalizes vector observations" in error
    assert "shape (84, 84, 4) (images): set agent.observation_norm: false" in error
    minatar = config_lib.load_config(
        REPO / "configs" / "dqn_minatar_breakout.yaml", ["agent.observation_norm=true"]
    )
    with pytest.raises(ConfigError, match=r"agent\.observation_norm normalizes vector obs"):
        build_run(minatar)
    with pytest.raises(ConfigError) as refused:
        config_lib.load_config(
            REPO / "configs" / "td3_cemrl_hopper_cpu.yaml", ["agent.observation_norm=true"]
        )
    assert str(refused.value).startswith(
        "agent.observation_norm: strategy cemrl trains the members' actors against one shared "
        "critic, which does not normalize observations: set agent.observation_norm: false"
    )


# --- float32 over long runs (issue 59) ----------------------------------------------------------

# observation_norm's cap on the count: past it, a batch of B weighs B / (2**20 + B).
COUNT_CAP = 2.0**20


def merged_in_float64(mean, var, count, batch_mean, batch_var, batch_count):
    """The merge in double precision: Chan et al.'s, the count capped at COUNT_CAP."""
    weight = batch_count / (min(count, COUNT_CAP) + batch_count)
    delta = batch_mean - mean
    mean = mean + weight * delta
    var = var + weight * ((batch_var - var) + delta * delta * (1.0 - weight))
    return mean, var, min(count + batch_count, COUNT_CAP)


@pytest.mark.optimized  # runs its program many times
def test_the_statistics_stay_float64s_over_1e8_observations():
    """1e8 observations in batches of 256: the float32 statistics are the float64 merge's to
    1e-5, where the `var * count` form had drifted -1.3e-3. Each batch is m + s * (+-1), of mean
    m and variance s**2 exactly, drawn as a real batch's are (two features: one off-centre)."""
    batches, size = 390_625, 256
    rng = np.random.default_rng(59)
    centre, spread = np.array([3.0, 1000.0]), np.array([2.0, 30.0])
    means = centre + spread / np.sqrt(size) * rng.standard_normal((batches, 2))
    sds = spread * np.sqrt(rng.chisquare(size - 1, (batches, 2)) / size)
    signs = jnp.asarray(np.resize([1.0, -1.0], size)[:, None], jnp.float32)

    def step(stats, moments):
        mean, sd = moments
        return merged(stats, mean + sd * signs), None

    start = initial_stats(EnvSpec(obs_shape=(2,), action_dim=1))
    scan = jax.jit(lambda xs: jax.lax.scan(step, start, xs)[0])
    stats = scan((jnp.asarray(means, jnp.float32), jnp.asarray(sds, jnp.float32)))
    for feature in range(2):
        mean, var, count = 0.0, 1.0, 0.0
        batch_moments = zip(
            means[:, feature].tolist(), (sds[:, feature] ** 2).tolist(), strict=True
        )
        for batch_mean, batch_var in batch_moments:
            mean, var, count = merged_in_float64(mean, var, count, batch_mean, batch_var, size)
        assert abs(float(stats.var[feature]) / var - 1.0) < 1e-5, (feature, stats.var, var)
        assert abs(float(stats.mean[feature]) - mean) < 1e-5 * abs(mean) + 1e-6
    assert float(stats.count) == COUNT_CAP


def test_the_statistics_still_move_after_2_24_updates():
    """After 2**24 batches of {3, 7} the count is capped, not stuck (float32's count + 2 was
    2**25 from there): a batch of {95, 105} still weighs 2 / (2**20 + 2), where it had weighed
    2 / 2**25 (the mean moved 5.7e-6, not 1.8e-4)."""
    start = initial_stats(EnvSpec(obs_shape=(1,), action_dim=1))
    steady = jnp.array([[3.0], [7.0]])
    long_run = jax.jit(
        lambda: jax.lax.fori_loop(0, 2**24, lambda _, stats: merged(stats, steady), start)
    )
    stats = long_run()
    assert (float(stats.mean[0]), float(stats.var[0])) == (5.0, 4.0)
    moved = merged(stats, jnp.array([[95.0], [105.0]]))
    want = merged_in_float64(5.0, 4.0, COUNT_CAP, 100.0, 25.0, 2.0)
    np.testing.assert_allclose(float(moved.mean[0]) - 5.0, want[0] - 5.0, rtol=1e-2)
    np.testing.assert_allclose(float(moved.var[0]) - 4.0, want[1] - 4.0, rtol=1e-2)
    assert float(stats.count) == float(moved.count) == COUNT_CAP


def test_the_first_batch_gives_its_own_statistics_however_small():
    """Merged into the initial variance 1 incrementally, a variance of 1e-8 would round to 0."""
    stats = merged(
        initial_stats(EnvSpec(obs_shape=(1,), action_dim=1)), jnp.array([[1e-4], [-1e-4]])
    )
    np.testing.assert_allclose(stats.var, [1e-8], rtol=1e-5)

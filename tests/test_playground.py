"""MuJoCo Playground on the device (env.id: playground/<Name>): its DeepMind Control Suite ids are
the package's own, ids that need robot models this machine lacks are refused with exit 2 saying
why, a humanoid joystick task's policy observes its dict's `state`, and an env's done is a
termination only, its time limit left to the rollout."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import envs
from fastpop.commands import cli
from fastpop.envs import playground_envs
from fastpop.envs.errors import MissingExtra, UnknownEnvironment
from tests.dependencies import require
from tests.helpers import metric_rows, train_here

require("mujoco_playground")

PRESET = Path(__file__).resolve().parents[1] / "configs" / "td3_gymnax_pendulum_cpu.yaml"


def test_ids_are_playgrounds_own_and_robots_without_models_are_refused(
    tmp_path, monkeypatch, capsys
):
    from mujoco_playground import dm_control_suite, registry

    assert tuple(dm_control_suite.ALL_ENVS) == playground_envs.CONTROL_SUITE
    others = tuple(name for name in registry.ALL_ENVS if name not in dm_control_suite.ALL_ENVS)
    assert others == playground_envs.NEEDS_MENAGERIE
    assert set(playground_envs.HUMANOID_JOYSTICKS) < set(playground_envs.NEEDS_MENAGERIE)
    for name in ("CartpoleBalance", "CheetahRun", *playground_envs.HUMANOID_JOYSTICKS):
        config = registry.get_default_config(name)
        assert config.episode_length == playground_envs.EPISODE_LENGTH and config.action_repeat == 1
    assert envs.check_env_id("playground/cartpolebalance") == "playground/CartpoleBalance"
    with pytest.raises(UnknownEnvironment, match="did you mean playground/CheetahRun") as error:
        envs.check_env_id("playground/CheetaRun")
    assert "its humanoid joystick tasks: playground/G1JoystickFlatTerrain, " in str(error.value)
    with pytest.raises(UnknownEnvironment, match="not its other robot tasks"):
        envs.check_env_id("playground/Go1JoystickFlatTerrain")
    monkeypatch.setattr(playground_envs, "menagerie_path", lambda: Path("/nonexistent"))
    argv = ["train", str(PRESET), "--set", "env.id=playground/G1JoystickFlatTerrain"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "playground/G1JoystickFlatTerrain needs the robot models of mujoco_menagerie's " in error
    assert "unitree_g1/, which this machine does not have (/nonexistent/unitree_g1)" in error
    assert "mjx_env.ensure_menagerie_exists()" in error  # how to fetch them, deliberately
    assert not list(tmp_path.iterdir())  # refused before anything is written
    (tmp_path / "menagerie" / "booster_t1" / "assets").mkdir(parents=True)
    monkeypatch.setattr(playground_envs, "menagerie_path", lambda: tmp_path / "menagerie")
    assert (
        envs.check_env_id("playground/t1joystickflatterrain") == "playground/T1JoystickFlatTerrain"
    )
    with pytest.raises(UnknownEnvironment, match="menagerie's unitree_g1/"):
        envs.check_env_id("playground/G1JoystickRoughTerrain")  # another robot's models
    monkeypatch.setattr(playground_envs, "playground_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[playground\]'"):
        envs.check_env_id("playground/CartpoleBalance")


def test_a_dict_observation_is_the_policys_entry_then_the_privileged_one():
    """A humanoid joystick task observes {state, privileged_state}: the adapter's reset and
    step hand the rollout [state | privileged_state] (the actor reads the first part alone:
    tests/test_asymmetric_critic.py), under jit and scan as the rollout runs them, and leave
    an array observation (the Control Suite's) as it is. (The tasks themselves need
    mujoco_menagerie's models and step far too slowly on a CPU for a test.)"""
    from flax import struct

    @struct.dataclass
    class State:
        obs: object
        counter: jax.Array

    def observe(counter):
        return {"privileged_state": -counter * jnp.ones(3), "state": counter * jnp.ones(2)}

    def step(state, action):
        assert not isinstance(state.obs, dict)  # the env's step makes its own observation
        return state.replace(obs=observe(state.counter + action), counter=state.counter + action)

    reset, viewed_step = playground_envs.observation_view(
        lambda key: State(observe(0.0), 0.0), step
    )

    def rollout(actions):
        return jax.lax.scan(lambda s, a: (viewed_step(s, a),) * 2, reset(None), actions)[1].obs

    observed = np.asarray(jax.jit(rollout)(jnp.array([1.0, 2.0, 3.0])))
    np.testing.assert_array_equal(observed, [[c, c, -c, -c, -c] for c in (1.0, 3.0, 6.0)])
    arrays, _ = playground_envs.observation_view(lambda key: State(jnp.zeros(2), 0.0), step)
    np.testing.assert_array_equal(arrays(None).obs, np.zeros(2))


def test_done_is_a_termination_and_the_time_limit_is_left_to_the_rollout():
    """The adapter's DeviceEnv is playground's own reset and step on MJX's JAX pipeline, with
    no time limit or reset of its own: stepped 1,100 times (past the 1,000-step limit the
    rollout applies, as for every family: tests/test_device_rollout.py), CartpoleBalance never
    says done (it ends only on NaN physics) and its simulated time only grows. (Its lanes in
    the rollout: tests/test_device_rollout.py. Training and evaluation are one code path for
    every family; a run's MJX programs compile too slowly on a CPU to repeat them here.)"""
    env = envs.device_envs.make_device_env("playground/CartpoleBalance")
    assert env.spec.obs_shape == (5,) and env.spec.action_dim == 1
    assert env.episode_length == playground_envs.EPISODE_LENGTH

    def rollout(key):
        reset_key, action_key = jax.random.split(key)
        actions = jax.random.uniform(action_key, (1100, 1), minval=-1.0, maxval=1.0)

        def one(state, action):
            state = env.step(state, action)
            return state, (state.done, state.reward, state.data.time, state.obs)

        return jax.lax.scan(one, env.reset(reset_key), actions)[1]

    done, reward, time, obs = jax.tree.map(np.asarray, jax.jit(rollout)(jax.random.key(0)))
    assert not done.any() and np.isfinite(obs).all()
    assert (np.diff(time) > 0).all()  # one trajectory: never reset inside the env
    assert ((reward >= 0) & (reward <= 1)).all()  # the Control Suite's rewards


def test_a_short_td3_run_on_cartpole_balance_makes_rows_returns_and_autoresets(tmp_path):
    """No DM Control task learns within test time on a CPU (the preset's CartpoleBalance: 700-990
    of 1,000 after 60k steps, results/playground_cpu): a short run of it, with 100-step episodes,
    evaluates every member twice, learns from the rows in between, and stores exactly one
    truncation every 100 steps per lane, each followed by its autoreset row (and the lane's
    first row, a reset step: fastpop.collect.device_rollout.init)."""
    preset = PRESET.with_name("td3_playground_cartpole_balance_cpu.yaml")
    short = ["train.total_env_steps=512", "eval.interval=256", "eval.episodes=1"]
    short += ["env.episode_length=100", "agent.hidden_sizes=[16,16]", "agent.batch_size=32"]
    short += ["replay.min_size=256", "collect.warmup_steps=256", "collect.chunk_len=16"]
    trained = train_here(tmp_path, preset, "population.size=2", *short)
    evaluated = metric_rows(trained.run_dir)
    assert [(r["eval_index"], r["member"]) for r in evaluated] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(0 <= r["return_mean"] <= 100 for r in evaluated)  # rewards in [0, 1]
    assert [r["updates"] > 0 for r in evaluated] == [False, False, True, True]
    buffers = trained.learner.replay.buffers
    rows = jax.tree.map(lambda x: np.asarray(x)[:, 0, :512], buffers.rows)  # (member, t) of lane 0
    assert (np.asarray(buffers.size) == 512).all() and not rows.terminated.any()
    ends = list(range(100, 511, 101))  # 100 steps, then the row the env resets on
    for member in range(2):
        assert np.flatnonzero(rows.truncated[member]).tolist() == ends
        assert np.flatnonzero(rows.autoreset[member]).tolist() == [0] + [t + 1 for t in ends]
    assert not rows.reward[rows.autoreset].any()

"""gymnax environments on the device (env.id: gymnax/<name>): ids checked as every family's
are, `done` a termination only (the registered time limit truncates, and bootstraps), DQN
populations learn CartPole-v1 on the device, MinAtar grids go through the configured torso."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import envs
from fastpop.envs import device_envs, gymnax_envs
from fastpop.envs.errors import MissingExtra, UnknownEnvironment
from fastpop.population import replay
from fastpop.run.parts import build_run
from tests.dependencies import require
from tests.helpers import metric_rows, train_here

gymnax = require("gymnax")

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CARTPOLE = CONFIGS / "dqn_gymnax_cartpole_cpu.yaml"
PENDULUM = CONFIGS / "td3_gymnax_pendulum_cpu.yaml"


def refusal(preset: Path, overrides: list[str]) -> str:
    with pytest.raises(config_lib.ConfigError) as error:
        build_run(config_lib.load_config(preset, overrides))
    return str(error.value)


def test_ids_are_normalized_and_wrong_ones_refused(monkeypatch):
    assert envs.check_env_id("gymnax/cartpole-v1") == "gymnax/CartPole-v1"
    assert envs.check_env_id("gymnax/breakout-minatar") == "gymnax/Breakout-MinAtar"
    with pytest.raises(UnknownEnvironment, match=r"did you mean gymnax/Breakout-MinAtar, "):
        envs.check_env_id("gymnax/Breakout-Minatr")
    message = refusal(PENDULUM, ["env.id=gymnax/Pendulum-v2"])
    assert message.startswith("env.id: gymnax/Pendulum-v2: unknown gymnax environment; did you")
    monkeypatch.setattr(gymnax_envs, "gymnax_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"install it with pip install -e '\.\[gymnax\]'"):
        envs.check_env_id("gymnax/CartPole-v1")


def test_actions_decide_the_algorithm_and_fields_their_family():
    assert refusal(PENDULUM, ["algo=dqn"]).startswith(
        "algo: dqn needs discrete actions, and gymnax/Pendulum-v1 has continuous ones: use "
        "td3 or sac"
    )
    assert refusal(CARTPOLE, ["algo=sac"]).startswith(
        "algo: sac needs continuous actions, and gymnax/CartPole-v1 has discrete ones: use dqn"
    )
    assert refusal(CARTPOLE, ["env.backend=spring"]).startswith(
        "env.backend: only brax environments (env.id: brax/<name>) have a physics backend"
    )
    assert refusal(CARTPOLE, ["collect.mode=processes"]).startswith(
        "collect.mode: processes steps gymnasium environments in collector processes, and "
        "gymnax/CartPole-v1 is stepped on the device"
    )
    assert refusal(CARTPOLE, ["agent.torso=minatar_cnn"]) == (
        "algo 'dqn' on gymnax/CartPole-v1: torso minatar_cnn needs image observations "
        "(H, W, C), not (4,)"
    )
    with pytest.raises(config_lib.ConfigError, match=r"agent\.torso: must be one of mlp, nature"):
        config_lib.load_config(CARTPOLE, ["agent.torso=cnn"])
    # null means the registered limit, which becomes the (truncating) episode_length.
    lengths = {"gymnax/CartPole-v1": 500, "gymnax/Pendulum-v1": 200, "gymnax/Freeway-MinAtar": 2500}
    for env_id, length in lengths.items():
        preset = CARTPOLE if device_envs.discrete_actions(env_id) else PENDULUM
        config = config_lib.load_config(preset, [f"env.id={env_id}"])
        assert config.env.episode_length == length


def test_done_is_a_termination_and_the_time_limit_is_left_to_the_rollout():
    env = device_envs.make_device_env("gymnax/Pendulum-v1")
    native, params = gymnax.make("Pendulum-v1")
    assert env.episode_length == params.max_steps_in_episode == 200
    # gymnax's own step says done at its time limit (and resets in place) ...
    native_state = native.reset(jax.random.key(0), params)[1].replace(time=199)
    done = native.step(jax.random.key(1), native_state, jnp.array([2.0]), params)[3]
    assert bool(done)
    # ... the adapter's never does: Pendulum has no terminal state.
    step = jax.jit(env.step)
    state, swing = env.reset(jax.random.key(0)), jnp.array([2.0])
    observations = [state.obs]
    for _ in range(250):  # past the registered limit, where gymnax's own step would reset
        state = step(state, swing)
        assert not bool(state.done)
        observations.append(state.obs)
    # Pendulum's observation is (cos, sin, angular velocity): one trajectory throughout, no
    # reset in place at step 200 (a reset would jump to a random angle at rest).
    angles = np.unwrap(np.arctan2(np.array(observations)[:, 1], np.array(observations)[:, 0]))
    speeds = np.array(observations)[:, 2]
    np.testing.assert_allclose(np.diff(angles), speeds[1:] * 0.05, atol=1e-4)
    # CartPole pushed one way falls over: a termination, the pole past 12 degrees.
    cartpole = device_envs.make_device_env("gymnax/CartPole-v1")
    state, steps = cartpole.reset(jax.random.key(1)), 0
    while not bool(state.done):
        state, steps = cartpole.step(state, jnp.int32(0)), steps + 1
    x, _, theta, _ = np.asarray(state.obs)
    assert steps < 50 and (abs(theta) > 12 * np.pi / 180 or abs(x) > 2.4)


# Uniform random actions hold gymnax's CartPole-v1 up for ~22 steps. This population (2
# members, seed 0, the preset's 10k env steps each) ends at 150-250 for every member in
# about 15 s on the 2-core CPU; the 4-member preset ended at 151-173.
LEARNED = 100.0


@pytest.mark.optimized  # trains to a threshold
def test_dqn_population_learns_cartpole_on_the_device(tmp_path, capsys):
    trained = train_here(tmp_path, CARTPOLE, "population.size=2", "eval.interval=10000")
    final = metric_rows(trained.run_dir)
    assert len(final) == 2 and all(r["return_mean"] >= LEARNED for r in final), final
    # Terminations are the pole falling or the cart leaving; the 500-step limit is no
    # termination (a member this good reaches it), so its transitions bootstrap.
    learner = trained.learner
    for member in range(2):
        buffer = jax.tree.map(lambda x, m=member: x[m], learner.replay.buffers)
        batch = replay.sample(learner.replay.spec, buffer, jax.random.key(member), 4096)
        next_obs = np.asarray(batch.next_obs)
        fell = (np.abs(next_obs[:, 2]) > 12 * np.pi / 180) | (np.abs(next_obs[:, 0]) > 2.4)
        np.testing.assert_array_equal(np.asarray(batch.terminated), fell)
    # Evaluation of the checkpoint on fresh device envs.
    from fastpop.commands import cli

    assert cli.main(["eval", str(trained.run_dir), "--member", "1", "--episodes", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"member 1 \(checkpoint \d+, 10,0\d\d env steps/member\): return", out)


@pytest.mark.optimized  # a CNN's updates at O0 run ~3x longer
@pytest.mark.parametrize("torso", ["minatar_cnn", "mlp"])
def test_minatar_grids_go_through_the_chosen_torso(tmp_path, torso):
    overrides = ["env.id=gymnax/Breakout-MinAtar", f"agent.torso={torso}"]
    config = config_lib.load_config(CARTPOLE, overrides)
    parts = build_run(config)
    assert (
        parts.learner.env_spec.obs_shape == (10, 10, 4) and parts.learner.env_spec.num_actions == 3
    )
    state = parts.learner.agent.init(jax.random.key(0), parts.learner.agent.default_hparams())
    shapes = {leaf.shape for leaf in jax.tree.leaves(state)}
    if torso == "minatar_cnn":  # 3x3 convolutions of 4 channels into 16, 8x8x16 -> 128 units
        assert {(3, 3, 4, 16), (8 * 8 * 16, 128), (128, 3)} <= shapes, shapes
    else:  # the grid flattened into the MLP
        assert {(400, 64), (64, 3)} <= shapes and (3, 3, 4, 16) not in shapes, shapes
    if torso == "minatar_cnn":  # a short run on the device: rows, updates, an evaluation
        short = ["train.total_env_steps=768", "eval.interval=768", "eval.episodes=2"]
        short += ["replay.min_size=256", "collect.warmup_steps=256"]
        trained = train_here(tmp_path, CARTPOLE, *overrides, "population.size=2", *short)
        evaluated = metric_rows(trained.run_dir)
        assert len(evaluated) == 2 and all(np.isfinite(r["return_mean"]) for r in evaluated)
        assert trained.learner.updates > 0

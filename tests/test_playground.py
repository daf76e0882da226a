"""MuJoCo Playground on the device (env.id: playground/<Name>): its DeepMind Control Suite ids are
the package's own, ids that need robot models this machine lacks are refused with exit 2 saying
why, and a TD3 population trains on CartpoleBalance with time limits that truncate."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

pytest.importorskip("mujoco_playground")

from fastpop import envs
from fastpop.commands import cli
from fastpop.envs import playground_envs
from fastpop.envs.errors import MissingExtra, UnknownEnvironment

PRESET = Path(__file__).resolve().parents[1] / "configs" / "td3_gymnax_pendulum_cpu.yaml"


def test_ids_are_playgrounds_own_and_robots_without_models_are_refused(
    tmp_path, monkeypatch, capsys
):
    from mujoco_playground import dm_control_suite, registry

    assert tuple(dm_control_suite.ALL_ENVS) == playground_envs.CONTROL_SUITE
    others = tuple(name for name in registry.ALL_ENVS if name not in dm_control_suite.ALL_ENVS)
    assert others == playground_envs.NEEDS_MENAGERIE
    for name in ("CartpoleBalance", "CheetahRun"):
        config = dm_control_suite.get_default_config(name)
        assert config.episode_length == playground_envs.EPISODE_LENGTH and config.action_repeat == 1
    assert envs.check_env_id("playground/cartpolebalance") == "playground/CartpoleBalance"
    with pytest.raises(UnknownEnvironment, match="did you mean playground/CheetahRun"):
        envs.check_env_id("playground/CheetaRun")
    monkeypatch.setattr(playground_envs, "menagerie_path", lambda: Path("/nonexistent"))
    argv = ["train", str(PRESET), "--set", "env.id=playground/Go1JoystickFlatTerrain"]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "playground/Go1JoystickFlatTerrain needs robot models from mujoco_menagerie" in error
    assert "this machine does not have (/nonexistent)" in error
    assert not list(tmp_path.iterdir())  # refused before anything is written
    monkeypatch.setattr(playground_envs, "playground_installed", lambda: False)
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[playground\]'"):
        envs.check_env_id("playground/CartpoleBalance")


def test_lanes_truncate_at_the_time_limit_and_keep_the_real_final_observation():
    """The device rollout on a Playground env (its step playground's own, on MJX's JAX
    pipeline): no terminations (CartpoleBalance ends only on NaN physics), a truncation every
    `TIME_LIMIT` steps whose row holds the real next state, then the reset step. (Training
    runs are the same code for every family: tests/test_device_mode.py, test_gymnax.py.)"""
    from fastpop.collect import device_rollout

    env = envs.device_envs.make_device_env("playground/CartpoleBalance")
    lanes, steps, time_limit = 3, 30, 12
    act = lambda obs, key, t: device_rollout.random_actions(env.spec, key, (lanes, 1))

    def one(state, key):
        new_state, row, _ = device_rollout.step(env, time_limit, state, act(None, key, 0))
        return new_state, (row, state.env)

    state = device_rollout.init(env, jax.random.key(0), lanes)
    run = jax.jit(lambda s, k: jax.lax.scan(one, s, jax.random.split(k, steps)))
    _, (rows, env_states) = run(state, jax.random.key(1))
    rows = jax.tree.map(np.asarray, rows)  # (steps, lanes, ...)
    assert not rows.terminated.any()
    truncated_at = sorted({int(t) for t in np.flatnonzero(rows.truncated.any(axis=1))})
    assert truncated_at == [11, 24] and rows.truncated[[11, 24]].all()  # 12 steps, reset, 12
    np.testing.assert_array_equal(rows.autoreset[[12, 25]], True)
    again = jax.jit(jax.vmap(jax.vmap(env.step)))(env_states, rows.action)
    starts = ~rows.autoreset[:-1]
    np.testing.assert_allclose(rows.obs[1:][starts], np.asarray(again.obs)[:-1][starts], atol=1e-5)
    assert (rows.reward[~rows.autoreset] > 0).all()  # CartpoleBalance pays (0, 1] per step

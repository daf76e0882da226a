"""Environment factory: specs, Atari preprocessing, seeding, autoreset and id checking."""

import numpy as np
import pytest

from fastpop.envs import (
    AtariOptions,
    MissingExtra,
    UnknownEnvironment,
    check_env_id,
    env_spec,
    gymnasium_envs,
    make_env,
    make_vector_env,
)
from tests.dependencies import require


def test_classic_control_specs():
    pendulum = env_spec("Pendulum-v1")
    assert pendulum.obs_shape == (3,)
    assert (pendulum.action_dim, pendulum.action_low, pendulum.action_high) == (1, -2.0, 2.0)
    assert not pendulum.discrete and pendulum.frame_stack == 1
    cartpole = env_spec("CartPole-v1")
    assert cartpole.obs_shape == (4,) and cartpole.num_actions == 2 and cartpole.discrete


def test_mujoco_spec_and_float32_observations(monkeypatch, tmp_path):
    require("mujoco")
    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warnings to MUJOCO_LOG.TXT in the cwd
    spec = env_spec("HalfCheetah-v5")
    assert spec.obs_shape == (17,) and spec.obs_dtype == np.float32
    assert (spec.action_dim, spec.action_low, spec.action_high) == (6, -1.0, 1.0)
    env = make_env("HalfCheetah-v5", seed=0)
    obs, _ = env.reset()
    assert obs.dtype == np.float32 and env.observation_space.contains(obs)
    env.close()


def test_atari_pong_preprocessing():
    require("ale_py")
    require("cv2")
    spec = env_spec("Pong")
    assert spec.obs_shape == (84, 84, 4) and spec.obs_dtype == np.uint8
    assert spec.num_actions == 6 and spec.frame_stack == 4
    env = make_env("PongNoFrameskip-v4", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    # At a reset the stack is padded with copies of the reset frame.
    assert all(np.array_equal(obs[..., 0], obs[..., k]) for k in range(1, 4))
    rewards = []
    for _ in range(200):
        next_obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not (terminated or truncated)
        # Channel-last, oldest first: each step shifts the stack by one frame.
        np.testing.assert_array_equal(next_obs[..., :-1], obs[..., 1:])
        obs = next_obs
        rewards.append(reward)
    assert set(rewards) <= {-1.0, 0.0, 1.0} and any(rewards)
    env.close()


def test_atari_rewards_clipped_for_training_only():
    require("ale_py")
    require("cv2")
    train, evaluate = (make_env("SpaceInvaders", 0, training=t) for t in (True, False))
    actions = np.random.default_rng(0).integers(train.action_space.n, size=150)
    clipped, raw = [], []
    for action in actions:
        obs, reward, *_ = train.step(action)
        eval_obs, eval_reward, *_ = evaluate.step(action)
        np.testing.assert_array_equal(obs, eval_obs)
        clipped.append(reward)
        raw.append(eval_reward)
    assert max(raw) > 1  # invaders are worth 5 to 30 points
    np.testing.assert_array_equal(clipped, np.sign(raw))


def test_atari_life_loss_is_terminal_but_game_goes_on():
    require("ale_py")
    require("cv2")
    options = AtariOptions(terminal_on_life_loss=True, fire_on_reset=True)
    env = make_env("Breakout", seed=1, atari=options)
    _, info = env.reset()
    assert info["lives"] == 5
    for _ in range(1000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert terminated and not truncated and info["lives"] == 4 and "episode" not in info
    _, info = env.reset()
    assert info["lives"] == 4  # the game continued instead of restarting
    env.close()
    # Evaluation ignores life-loss terminals: the first termination is the game over.
    env = make_env("Breakout", seed=1, training=False, atari=options)
    env.reset()
    for _ in range(5000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            break
    assert terminated and info["lives"] == 0 and "episode" in info
    env.close()


def test_vector_env_is_deterministic():
    def rollout():
        vector = make_vector_env("CartPole-v1", 3, seed=7)
        observations = [vector.reset(seed=7)[0]]
        rng = np.random.default_rng(0)
        for _ in range(19):
            observations.append(vector.step(rng.integers(2, size=3))[0])
        vector.close()
        return np.stack(observations)

    first, second = rollout(), rollout()
    np.testing.assert_array_equal(first, second)
    # Environment i is seeded with seed + i: different starts, each reproducible alone.
    assert not np.array_equal(first[0, 0], first[0, 1])
    single, _ = make_env("CartPole-v1", seed=8).reset(seed=8)
    np.testing.assert_array_equal(first[0, 1], single)


def test_vector_env_next_step_autoreset():
    vector = make_vector_env("CartPole-v1", 2, seed=0)
    vector.reset(seed=0)
    actions = np.zeros(2, dtype=np.int64)  # always push left: the pole falls within ~10 steps
    for _ in range(100):
        _, _, terminated, truncated, _ = vector.step(actions)
        assert not truncated.any()
        if terminated[0]:
            break
    assert terminated[0]
    obs, reward, terminated, truncated, _ = vector.step(actions)
    assert reward[0] == 0.0 and not terminated[0] and not truncated[0]
    assert np.all(np.abs(obs[0]) <= 0.05)  # a CartPole reset state
    vector.close()


def test_check_env_id_suggests_close_ids():
    with pytest.raises(UnknownEnvironment, match=r"'HalfCheeta-v5'; did you mean HalfCheetah-v5"):
        check_env_id("HalfCheeta-v5")
    with pytest.raises(UnknownEnvironment, match="did you mean Pong"):
        check_env_id("Pnog")
    with pytest.raises(UnknownEnvironment, match="neither a registered gymnasium id"):
        check_env_id("NoSuchThing-v9")
    assert issubclass(UnknownEnvironment, ValueError)


def test_check_env_id_normalizes():
    require("ale_py")
    require("cv2")
    for spelling in ("Pong", "pong", "PongNoFrameskip-v4", "Pong-v0", "ALE/Pong-v5"):
        assert check_env_id(spelling) == "ALE/Pong-v5"
    assert check_env_id("space_invaders") == "ALE/SpaceInvaders-v5"
    assert check_env_id("CartPole-v1") == "CartPole-v1"
    assert check_env_id("Blackjack-v1") == "Blackjack-v1"  # gymnasium's card game, not Atari


def test_check_env_id_names_missing_extra(monkeypatch):
    installed = gymnasium_envs._module_available
    monkeypatch.setattr(gymnasium_envs, "_module_available", lambda name: False)
    with pytest.raises(MissingExtra, match=r"fastpop\[atari\]"):
        check_env_id("Pong")
    monkeypatch.setattr(
        gymnasium_envs, "_module_available", lambda name: name != "mujoco" and installed(name)
    )
    with pytest.raises(
        MissingExtra, match=r"'Hopper-v5' needs the 'mujoco' package.*fastpop\[mujoco\]"
    ):
        check_env_id("Hopper-v5")
    # brax and playground bring `mujoco` without imageio, which gymnasium's MuJoCo envs import
    monkeypatch.setattr(
        gymnasium_envs, "_module_available", lambda name: name != "imageio" and installed(name)
    )
    with pytest.raises(
        MissingExtra, match=r"'HalfCheetah-v5' needs the 'imageio' package.*fastpop\[mujoco\]"
    ):
        check_env_id("HalfCheetah-v5")
    assert check_env_id("Pendulum-v1") == "Pendulum-v1"


def test_atari_options_validated():
    with pytest.raises(ValueError, match="frame_stack"):
        AtariOptions(frame_stack=0)
    with pytest.raises(ValueError, match="repeat_action_probability"):
        AtariOptions(repeat_action_probability=1.5)


def test_mujoco_warns_about_gymnasiums_own_model_files_nowhere(capfd):
    """HalfCheetah's model (gymnasium's file) uses settotalmass, which MuJoCo calls deprecated
    each time a process compiles it: once per collector. fastpop's envs do not print it; other
    MuJoCo warnings still reach stderr as MuJoCo words them."""
    require("mujoco")
    import os
    import subprocess
    import sys
    from pathlib import Path

    from fastpop.envs import mujoco_warnings

    make = "from fastpop.envs import make_vector_env; make_vector_env('HalfCheetah-v5', 2, 0)"
    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": str(repo)}  # this checkout's fastpop
    made = subprocess.run(
        [sys.executable, "-c", make], env=environment, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    assert "settotalmass" not in made.stderr + made.stdout
    mujoco_warnings._print_unless_asset_deprecation("Nan, Inf or huge value in QACC at DOF 0")
    assert capfd.readouterr().err == "WARNING: Nan, Inf or huge value in QACC at DOF 0\n"

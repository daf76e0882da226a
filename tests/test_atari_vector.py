"""ale_py's vector env in the collectors (fastpop/envs/atari_vector.py) against the gymnasium path.

Both paths run the same operations (frame skip, max-pool of the last two frames, the ALE
grayscale palette, OpenCV's INTER_AREA resize), so with the reset no-ops turned off
(noop_max=0) the same seeds and actions give the same observations, rewards and flags bit for
bit, across autoresets, time limits and life-loss terminals. With no-ops on they cannot: the
vector env draws the number of no-op frames from ALE's own generator (uniform in [0, noop_max],
gymnasium's path in [1, noop_max] from its SeedSequence), so there the tests check the
properties that must still hold: shapes and dtypes, reset padding, the stack shifting by one
frame per step, determinism per seed, reward clipping for training only.
"""

from __future__ import annotations

import numpy as np

from fastpop import config
from fastpop.collect.lockstep_envs import LockstepEnvs, lockstep_envs
from fastpop.envs import AtariOptions, atari_vector, make_vector_env
from fastpop.envs.atari_vector import AtariLockstepEnvs, shift_in
from tests.dependencies import require

require("cv2")

ale_py = require("ale_py")


def _both(game, num_envs, seed, options, training=True):
    gymnasium = LockstepEnvs(
        make_vector_env(game, num_envs, seed, training=training, atari=options)
    )
    vector = AtariLockstepEnvs(game, num_envs, seed, training=training, options=options)
    return gymnasium, vector


def _assert_same_steps(gymnasium, vector, seed, steps, action_seed=0):
    """Steps both with the same random actions; returns the flags (steps, 2, envs) and the
    vector env's lives after each step (steps, envs)."""
    np.testing.assert_array_equal(vector.reset(seed), gymnasium.reset(seed))
    rng = np.random.default_rng(action_seed)
    flags, lives = [], []
    for _ in range(steps):
        actions = rng.integers(gymnasium.action_space.nvec[0], size=len(gymnasium.envs))
        want, got = gymnasium.step(actions), vector.step(actions)
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
        flags.append(want[2:])
        lives.append(vector.lives)
    gymnasium.close()
    vector.close()
    return np.array(flags), np.array(lives)


def test_same_frames_rewards_and_time_limits_as_gymnasium():
    # 80 agent steps per episode: every env is truncated and autoreset twice.
    options = AtariOptions(noop_max=0, max_episode_frames=320)
    flags, _ = _assert_same_steps(*_both("Pong", 2, 11, options), seed=11, steps=170)
    terminated, truncated = flags[:, 0], flags[:, 1]
    assert truncated.sum() == 4 and not terminated.any()


def test_life_loss_terminals_continue_the_game_as_gymnasium():
    """Rows after a lost life (one no-op step of the running game, reward 0, reset padding)
    and after a game over (a new game) equal gymnasium's `TerminalOnLifeLoss` path's."""
    options = AtariOptions(noop_max=0, terminal_on_life_loss=True)
    flags, lives = _assert_same_steps(*_both("Breakout", 2, 3, options), seed=3, steps=200)
    after_terminal = lives[1:][flags[:-1, 0]]  # the lives on the row after each terminal
    assert (after_terminal < 5).any(), "a lost life continued the game"
    assert (after_terminal == 5).any(), "a game over started a new game"


class _ScriptedVector:
    """Stands in for ale_py's vector env of one game: each step returns the next scripted
    (frame value, reward, terminated, truncated, lives); a reset returns frame 99, 5 lives."""

    def __init__(self, script):
        self.script, self.sent, self.reset_masks = iter(script), [], []

    def step(self, actions):
        self.sent.append(int(actions[0]))
        frame, reward, terminated, truncated, lives = next(self.script)
        info = {"lives": np.array([lives], np.int32)}
        flags = np.array([terminated]), np.array([truncated])
        return np.full((1, 1, 84, 84), frame, np.uint8), np.array([reward], np.int32), *flags, info

    def reset(self, seed=None, options=None):
        self.reset_masks.append(options["reset_mask"].tolist())
        return np.full((1, 1, 84, 84), 99, np.uint8), {"lives": np.array([5], np.int32)}


def test_rows_after_a_lost_life_including_one_that_ends_the_game():
    """The no-op step after a lost life: action 0, reward 0, flags False, reset padding; when
    that step ends the game (too rare to meet in the tests above), the game is reset at once."""
    envs = AtariLockstepEnvs("Breakout", 1, 0, options=AtariOptions(terminal_on_life_loss=True))
    real = envs._vector
    envs.reset(0)  # 5 lives
    envs._vector = scripted = _ScriptedVector(
        [
            (10, 1, False, False, 5),
            (11, 0, False, False, 4),  # a life lost: terminal
            (12, 1, False, False, 4),  # the no-op step of the running game
            (13, 0, False, False, 3),  # another life lost
            (14, 0, True, False, 0),  # the no-op step ends the game
            (15, -1, False, False, 5),
        ]
    )
    rows = [envs.step(np.array([3])) for _ in range(6)]
    assert scripted.sent == [3, 3, 0, 3, 0, 3] and scripted.reset_masks == [[True]]
    rewards = [float(row[1][0]) for row in rows]
    terminated = [bool(row[2][0]) for row in rows]
    assert rewards == [1, 0, 0, 0, 0, -1] and terminated == [False, True, False, True, False, False]
    assert not any(row[3][0] for row in rows)
    last_frames = [row[0][0, 0, 0].tolist() for row in rows]
    assert last_frames[1][-2:] == [10, 11] and last_frames[2] == [12] * 4
    assert last_frames[4] == [99] * 4 and last_frames[5] == [99, 99, 99, 15]
    envs._vector = real
    envs.close()


def test_properties_with_reset_noops():
    """Default options (up to 30 no-op frames per reset): the properties both paths share."""
    seed, num_envs = 4, 2
    vector = AtariLockstepEnvs("Pong", num_envs, seed)
    again = AtariLockstepEnvs("Pong", num_envs, seed)
    obs = vector.reset(seed)
    assert obs.shape == (num_envs, 84, 84, 4) and obs.dtype == np.uint8
    np.testing.assert_array_equal(obs, again.reset(seed))
    assert all(np.array_equal(obs[..., 0], obs[..., k]) for k in range(1, 4))  # reset padding
    rewards = []
    for _ in range(150):
        actions = vector.action_space.sample()
        assert actions.shape == (num_envs,) and vector.action_space.nvec[0] == 6
        next_obs, reward, terminated, truncated = vector.step(actions)
        np.testing.assert_array_equal(next_obs, again.step(actions)[0])  # seeded
        assert not (terminated | truncated).any()
        np.testing.assert_array_equal(next_obs[..., :-1], obs[..., 1:])  # oldest first
        obs = next_obs
        rewards.append(reward)
    assert set(np.concatenate(rewards)) <= {-1.0, 0.0, 1.0}
    vector.close()
    again.close()


def test_rewards_clipped_for_training_only():
    options = AtariOptions(noop_max=0)
    train, evaluate = (
        AtariLockstepEnvs("SpaceInvaders", 1, 0, training=t, options=options) for t in (True, False)
    )
    np.testing.assert_array_equal(train.reset(0), evaluate.reset(0))
    actions = np.random.default_rng(0).integers(6, size=(150, 1))
    clipped, raw = [], []
    for action in actions:
        obs, reward, *_ = train.step(action)
        eval_obs, eval_reward, *_ = evaluate.step(action)
        np.testing.assert_array_equal(obs, eval_obs)
        clipped.append(reward)
        raw.append(eval_reward)
    assert max(raw) > 1  # invaders are worth 5 to 30 points
    np.testing.assert_array_equal(clipped, np.sign(raw))


def test_shift_in_word_path_equals_slices():
    rng = np.random.default_rng(0)
    for depth in (2, 3, 4, 8):
        stack = rng.integers(256, size=(3, 5, 7, depth), dtype=np.uint8)
        frames = rng.integers(256, size=(3, 5, 7), dtype=np.uint8)
        shifted = shift_in(stack, frames)
        np.testing.assert_array_equal(shifted[..., :-1], stack[..., 1:])
        np.testing.assert_array_equal(shifted[..., -1], frames)
        assert shifted.dtype == np.uint8 and shifted.flags.c_contiguous


def test_collectors_choose_the_vector_env_where_it_applies(monkeypatch):
    envs, stepped_by = lockstep_envs("Pong", 2, 0, atari_vector=True, num_collectors=2)
    assert isinstance(envs, AtariLockstepEnvs) and stepped_by.startswith("ale_py AtariVectorEnv")
    envs.close()
    envs, stepped_by = lockstep_envs("Pong", 2, 0, atari_vector=False)
    assert isinstance(envs, LockstepEnvs) and "atari_vector: false" in stepped_by
    envs.close()
    fire = AtariOptions(fire_on_reset=True)
    envs, stepped_by = lockstep_envs("Breakout", 1, 0, atari=fire)
    assert isinstance(envs, LockstepEnvs) and "fire_on_reset" in stepped_by
    envs.close()
    envs, stepped_by = lockstep_envs("CartPole-v1", 1, 0)
    assert isinstance(envs, LockstepEnvs) and stepped_by == "gymnasium"
    envs.close()
    monkeypatch.delattr(ale_py, "AtariVectorEnv")
    assert "no AtariVectorEnv" in atari_vector.unavailable_reason(AtariOptions())
    envs, stepped_by = lockstep_envs("Pong", 1, 0)
    assert isinstance(envs, LockstepEnvs) and "no AtariVectorEnv" in stepped_by
    envs.close()
    # (cores, a collector's envs, collectors, its emulator threads)
    for cores, slots, collectors, threads in [(2, 4, 1, 2), (2, 4, 3, 1), (16, 4, 8, 2)]:
        monkeypatch.setattr(atari_vector, "usable_cores", lambda cores=cores: cores)
        assert atari_vector.default_threads(slots, collectors) == threads, (cores, slots)
    assert atari_vector.default_threads(1, 1) == 1  # never more threads than envs
    parsed = config.config_from_dict({"collect": {"atari_vector": False}})
    assert parsed.collect.atari_vector is False and config.Config().collect.atari_vector


def test_a_restarted_game_resets_now_on_both_paths_and_steps_on_as_before():
    """A fresh trial's game (`restart`): each path resets it at once, its stack padded with the
    reset frame, and from there both step alike; the other game runs on."""
    gymnasium, vector = _both("Pong", 2, 3, AtariOptions(noop_max=0))
    rng = np.random.default_rng(0)
    obs = vector.reset(3)
    np.testing.assert_array_equal(gymnasium.reset(3), obs)
    for step in range(60):
        if step == 30:
            restarted = [env.restart(np.array([False, True]), obs) for env in (gymnasium, vector)]
            (mine, reset), (theirs, their_reset) = restarted
            assert reset.tolist() == their_reset.tolist() == [False, True]
            np.testing.assert_array_equal(mine, theirs)
            assert (theirs[1] == theirs[1][..., :1]).all()  # padded with the reset frame
            np.testing.assert_array_equal(theirs[0], obs[0])
        actions = rng.integers(gymnasium.action_space.nvec[0], size=2)
        want, got = gymnasium.step(actions), vector.step(actions)
        for mine, theirs in zip(got, want, strict=True):
            np.testing.assert_array_equal(mine, theirs)
        obs = got[0]
    gymnasium.close()
    vector.close()

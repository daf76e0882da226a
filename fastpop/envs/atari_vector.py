"""Atari collection on ale_py's `AtariVectorEnv`: emulation, frame skip, max-pool, grayscale and
resize in C++ threads, one call per step for all of a collector's environments.

`AtariLockstepEnvs` has `lockstep_envs.LockstepEnvs`'s interface (reset, step, action_space, close)
and the semantics of `envs.make_env`'s Atari preprocessing (`AtariOptions`), built from the
vector env's pieces that match it and Python for those that do not:

- the vector env steps with `frameskip` emulator frames per step, the pixel-wise max of the last
  two, the ALE grayscale palette and OpenCV's INTER_AREA resize to screen_size: the same
  operations as gymnasium's `AtariPreprocessing`, and the same frames bit for bit (tested);
- frames are stacked here, channel-last and oldest first, and every reset row (a new game, or
  the step after a lost life) is padded with copies of its frame, as `FrameStackObservation(
  padding_type="reset")` does and the replay rebuilds (ALE pads with zeros, channel-first);
- a lost life is a training terminal detected here from the lives count, as `TerminalOnLifeLoss`
  does: the next row is one no-op step of the running game, not a new game (ALE's own
  `episodic_life` restarts the game);
- rewards are clipped to [-1, 1] by the vector env for training (integer scores: their sign);
  the next-step autoreset rows (reward 0, flags False) are the vector env's own.

What differs from the gymnasium path (so the same seed gives other episodes, not other rules):
the number of no-op frames after a reset comes from ALE's own generator, uniform in
[0, noop_max] instead of [1, noop_max]; the time limit counts the frames after those no-ops, so
an episode may last up to noop_max frames longer (of 108,000); the seed goes to ALE and its
no-op generator directly instead of through gymnasium's SeedSequence. `fire_on_reset` is not
expressible (the vector env presses FIRE for one frame before the no-ops, gymnasium's path one
agent step after them), so `lockstep_envs.lockstep_envs` falls back to gymnasium for it.
"""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np

from fastpop.envs import AtariOptions, check_env_id
from fastpop.machine import usable_cores


def unavailable_reason(options: AtariOptions) -> str | None:
    """Why `AtariLockstepEnvs` cannot run these options here, or None when it can."""
    try:
        import ale_py
    except ImportError:
        return "ale_py is not installed"
    if not hasattr(ale_py, "AtariVectorEnv"):
        return f"ale_py {ale_py.__version__} has no AtariVectorEnv (0.11 or newer has)"
    if options.fire_on_reset:
        return "fire_on_reset presses FIRE differently in ale_py's vector env"
    return None


def default_threads(num_envs: int, num_collectors: int) -> int:
    """Emulator threads of one collector: its share of the cores this process may use. The
    learner is not counted: it idles through the warm-up, which a collector's threads then
    step on every core (dqn_pbt_pong_cpu on 2 cores: learning 3 s sooner, the same updates
    per second after; results/startup/README.md), and threads waiting for it cost no CPU."""
    return max(1, min(num_envs, usable_cores() // num_collectors))


# A pixel's stacked frames as one machine word: shifting the word moves every frame one place.
_WORDS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def shift_in(stack: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """A new uint8 stack (..., depth): stack[..., 1:] followed by frames (...)."""
    depth = stack.shape[-1]
    word = _WORDS.get(depth)
    if word is None or sys.byteorder != "little" or not stack.flags.c_contiguous:
        shifted = np.empty_like(stack)
        shifted[..., :-1] = stack[..., 1:]
        shifted[..., -1] = frames
        return shifted
    # Little-endian: byte k of a pixel's word is frame k, so >> 8 drops the oldest (a slice
    # copy with a stride of depth bytes took 9x as long for 4 Pong frames).
    shifted = np.right_shift(stack.view(word).reshape(frames.shape), 8)
    newest = frames.astype(word)
    np.left_shift(newest, 8 * (depth - 1), out=newest)
    np.bitwise_or(shifted, newest, out=shifted)
    return shifted.view(np.uint8).reshape(stack.shape)


class AtariLockstepEnvs:
    """`num_envs` Atari games stepped by one `ale_py.AtariVectorEnv` under next-step autoreset.

    Environment i is seeded with seed + i at `reset(seed)`; the batched action space (warm-up
    actions) with `seed`. Observations: (num_envs, screen_size, screen_size, frame_stack) uint8.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int,
        *,
        training: bool = True,
        options: AtariOptions | None = None,
        num_threads: int = 1,
    ):
        from ale_py import AtariVectorEnv

        options = options or AtariOptions()
        if (reason := unavailable_reason(options)) is not None:
            raise ValueError(f"no vector env for {env_id}: {reason}")
        env_id = check_env_id(env_id)
        self._vector = AtariVectorEnv(
            gym.spec(env_id).kwargs["game"],  # the ROM's snake_case name
            num_envs,
            num_threads=num_threads,
            max_num_frames_per_episode=options.max_episode_frames,
            repeat_action_probability=options.repeat_action_probability,
            full_action_space=options.full_action_space,
            img_height=options.screen_size,
            img_width=options.screen_size,
            grayscale=True,
            stack_num=1,  # stacked here, channel-last and padded with the reset frame
            frameskip=options.frame_skip,
            maxpool=options.frame_skip > 1,
            noop_max=options.noop_max + 1 if options.noop_max else 0,  # ALE draws [0, n - 1]
            episodic_life=False,  # it would restart the game; life losses are handled here
            life_loss_info=False,
            reward_clipping=training and options.clip_rewards,
            use_fire_reset=False,
        )
        self.num_envs = num_envs
        self._life_loss_terminal = training and options.terminal_on_life_loss
        self.action_space = self._vector.action_space  # batched, for warm-up actions
        self.action_space.seed(seed)
        size, depth = options.screen_size, options.frame_stack
        self.single_observation_space = gym.spaces.Box(0, 255, (size, size, depth), np.uint8)
        self.single_action_space = self._vector.single_action_space
        self._stack = np.zeros((num_envs, *self.single_observation_space.shape), np.uint8)
        self._lives = np.zeros(num_envs, np.int64)
        self._autoreset = np.zeros(num_envs, bool)  # the game ended: the vector env resets it
        self._life_reset = np.zeros(num_envs, bool)  # a life was lost: one no-op step next

    @property
    def lives(self) -> np.ndarray:
        """Each game's lives after the last step (0 in games without lives)."""
        return self._lives.copy()

    def reset(self, seed: int) -> np.ndarray:
        """Observations of every env reset with seeds seed, seed + 1, ... (as LockstepEnvs)."""
        obs, info = self._vector.reset(seed=seed)
        self._autoreset[:] = False
        self._life_reset[:] = False
        self._lives = info["lives"].astype(np.int64)
        self._stack = np.repeat(obs[:, -1, :, :, None], self._stack.shape[-1], axis=-1)
        return self._stack

    def step(self, actions):
        """(obs, reward, terminated, truncated), one per env; an env whose episode ended at the
        previous step is reset instead (reward 0, flags False)."""
        life_reset = self._life_reset
        actions = np.where(life_reset, 0, np.asarray(actions)).astype(np.int64)
        obs, reward, terminated, truncated, info = self._vector.step(actions)
        frames, lives = obs[:, -1], info["lives"].astype(np.int64)
        game_over = life_reset & (terminated | truncated)
        if game_over.any():  # the no-op step after a lost life ended the game: a new one
            obs, info = self._vector.reset(options={"reset_mask": game_over})
            frames = np.where(game_over[:, None, None], obs[:, -1], frames)
            lives = np.where(game_over, info["lives"], lives)
        resets = self._autoreset | life_reset
        reward = np.where(resets, 0.0, reward)
        terminated, truncated = terminated & ~resets, truncated & ~resets
        life_lost = np.zeros_like(resets)
        if self._life_loss_terminal:
            life_lost = ~(terminated | truncated | resets) & (lives > 0) & (lives < self._lives)
            terminated = terminated | life_lost
        self._lives = lives
        self._autoreset, self._life_reset = (terminated | truncated) & ~life_lost, life_lost
        self._stack = self._stacked(frames, resets)
        return self._stack, reward, terminated, truncated

    def restart(self, envs: np.ndarray, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(obs, reset): the games where `envs` (bool) reset now, ending their episodes unflagged
        (a fresh trial starts in them), and which were; a game that ended at the previous step is
        left to its reset step (as `LockstepEnvs.restart`, collect/lockstep_envs.py). `obs` is
        the last stack."""
        reset = np.asarray(envs, bool) & ~self._autoreset
        if not reset.any():
            return obs, reset
        new, info = self._vector.reset(options={"reset_mask": reset})
        self._life_reset[reset] = False
        self._lives = np.where(reset, info["lives"].astype(np.int64), self._lives)
        self._stack = self._stack.copy()
        self._stack[reset] = new[reset][:, -1, :, :, None]
        return self._stack, reset

    def _stacked(self, frames: np.ndarray, resets: np.ndarray) -> np.ndarray:
        """A new stack (the caller keeps the previous one): oldest first, reset rows padded."""
        stack = shift_in(self._stack, frames)
        if resets.any():
            stack[resets] = frames[resets][..., None]
        return stack

    def close(self) -> None:
        self._vector.close()

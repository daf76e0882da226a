"""Atari preprocessing of one gymnasium ALE env: the DQN setup of Mnih et al. (2015) with the
episode conventions of Machado et al. (2018) (`AtariOptions`), life-loss terminals that keep the
game going, FIRE after a reset, and frames stacked channel-last, (84, 84, 4) uint8.

Which ids are Atari games, and what to install for them, is gymnasium_envs.py's
(`check_env_id`); ale_py's vector env, with the same semantics, is atari_vector.py's.
"""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np


@dataclasses.dataclass(frozen=True)
class AtariOptions:
    """Atari preprocessing. The defaults are the DQN Nature setup (Mnih et al. 2015) with the
    episode conventions of Machado et al. (2018): no life-loss terminals, no FIRE on reset."""

    noop_max: int = 30
    """Each reset takes a random number of no-op actions in [1, noop_max] (0 turns it off)."""
    frame_skip: int = 4
    """Emulator frames per agent step (the action is repeated); the observation is the pixel-wise
    max of the last two frames, which removes Atari sprite flicker."""
    screen_size: int = 84
    """Frames are converted to grayscale and resized to screen_size x screen_size."""
    frame_stack: int = 4
    """Frames stacked on the last observation axis, oldest first; at a reset the stack is filled
    with copies of the reset frame (gymnasium's padding_type="reset", as the replay rebuilds it)."""
    terminal_on_life_loss: bool = False
    """Training only: losing a life is a `terminated` step (the game itself continues after the
    following autoreset). Mnih et al. used it; Machado et al. recommend against it."""
    clip_rewards: bool = True
    """Training only: rewards are replaced by their sign. Evaluation always returns the raw game
    score."""
    fire_on_reset: bool = False
    """Press FIRE after every reset (and after a lost life with terminal_on_life_loss) in games
    whose action 1 is FIRE, e.g. Breakout, which otherwise wait for it; ignored in other games."""
    repeat_action_probability: float = 0.0
    """Sticky actions: the chance that the emulator repeats the previous action on each frame.
    0.0 is the deterministic DQN Nature setting most published Atari numbers use; 0.25 is the
    ALE v5 default recommended by Machado et al. for evaluating robustness."""
    full_action_space: bool = False
    """Use all 18 joystick actions instead of the game's minimal action set (Pong: 6)."""
    max_episode_frames: int = 108_000
    """Episodes are truncated after this many emulator frames (108,000 = 30 minutes of play,
    27,000 agent steps at frame_skip 4)."""

    def __post_init__(self):
        for name in ("frame_skip", "screen_size", "frame_stack", "max_episode_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"AtariOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise ValueError(f"AtariOptions.noop_max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ValueError(
                "AtariOptions.repeat_action_probability must be in [0, 1], "
                f"got {self.repeat_action_probability}"
            )


class TerminalOnLifeLoss(gym.Wrapper):
    """A lost life ends the (training) episode, but the game goes on.

    gymnasium's `AtariPreprocessing(terminal_on_life_loss=True)` lets the following reset restart
    the whole game, so an agent would never play its later lives. Here (as in Mnih et al. and
    baselines' EpisodicLifeEnv) the reset after a lost life is one no-op step of the running game;
    only a real game over (or truncation, or a reset not after a lost life) resets the game.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._lives = 0
        self._life_lost = False

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        self._life_lost = not (terminated or truncated) and 0 < lives < self._lives
        self._lives = lives
        return obs, reward, terminated or self._life_lost, truncated, info

    def reset(self, *, seed=None, options=None):
        obs, info, game_over = None, {}, True
        if self._life_lost and seed is None:
            obs, _, terminated, truncated, info = self.env.step(0)
            game_over = terminated or truncated
        if game_over:
            obs, info = self.env.reset(seed=seed, options=options)
        self._life_lost = False
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireOnReset(gym.Wrapper):
    """Presses FIRE (action 1) after each reset, for games that wait for it to start."""

    def reset(self, *, seed=None, options=None):
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(options=options)
        return obs, info


class ChannelLast(gym.ObservationWrapper):
    """Moves the frame-stack axis of `FrameStackObservation` (first) to the end."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            low=np.moveaxis(space.low, 0, -1),
            high=np.moveaxis(space.high, 0, -1),
            dtype=space.dtype,
        )

    def observation(self, observation):
        return np.ascontiguousarray(np.moveaxis(observation, 0, -1))


def _reward_sign(reward) -> float:
    return float(np.sign(reward))


def make_atari_env(
    env_id: str, training: bool, options: AtariOptions, render_mode: str | None = None
) -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(
        env_id,
        obs_type="grayscale",  # the preprocessing reads the screen itself; skip the RGB copy
        frameskip=1,  # AtariPreprocessing skips (and max-pools) frames instead
        repeat_action_probability=options.repeat_action_probability,
        full_action_space=options.full_action_space,
        max_num_frames_per_episode=options.max_episode_frames,
        render_mode=render_mode,  # rgb_array renders the colour screen, whatever obs_type is
    )
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=options.noop_max,
        frame_skip=options.frame_skip,
        screen_size=options.screen_size,
        terminal_on_life_loss=False,
    )
    # Below life-loss terminals and reward clipping: `info["episode"]` is a whole game's score.
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if training and options.terminal_on_life_loss:
        env = TerminalOnLifeLoss(env)
    meanings = env.unwrapped.get_action_meanings()
    if options.fire_on_reset and len(meanings) > 1 and meanings[1] == "FIRE":
        env = FireOnReset(env)
    if training and options.clip_rewards:
        env = gym.wrappers.TransformReward(env, _reward_sign)
    env = gym.wrappers.FrameStackObservation(env, options.frame_stack, padding_type="reset")
    return ChannelLast(env)

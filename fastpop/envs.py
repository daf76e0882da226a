"""Environment construction and the EnvSpec of a gymnasium environment's spaces."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fastpop.types import EnvSpec


def env_spec_from_spaces(observation_space: gym.Space, action_space: gym.Space) -> EnvSpec:
    """Shapes an agent needs, from one (non-vector) environment's spaces."""
    obs_shape = tuple(observation_space.shape)
    obs_dtype = np.dtype(observation_space.dtype)
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape, obs_dtype, num_actions=int(action_space.n))
    if isinstance(action_space, gym.spaces.Box):
        low, high = np.unique(action_space.low), np.unique(action_space.high)
        if len(low) != 1 or len(high) != 1:
            raise ValueError(
                f"action bounds must be the same for every dimension, got low={action_space.low}"
                f" high={action_space.high}"
            )
        return EnvSpec(
            obs_shape,
            obs_dtype,
            action_dim=int(np.prod(action_space.shape)),
            action_low=float(low[0]),
            action_high=float(high[0]),
        )
    raise ValueError(f"unsupported action space {action_space}; use Box or Discrete")


def make_vector_env(env_id: str, num_envs: int, seed: int) -> gym.vector.VectorEnv:
    """Synchronous vector env with next-step autoreset (the replay's row convention)."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs

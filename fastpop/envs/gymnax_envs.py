"""gymnax environments by id: `gymnax/<name>` (`gymnax/CartPole-v1`, `gymnax/Breakout-MinAtar`,
...), stepped on the device through the DeviceEnv protocol (device_envs.py).

gymnax's `done` mixes termination and its time limit (`state.time >= max_steps_in_episode`), and
its `step` resets in place, losing the final observation. The adapter calls `step_env` (no reset)
with the time limit out of reach, so `done` is a termination only; the registered limit becomes
the rollout's `episode_length`, which truncates (bootstrapped) and autoresets next step as brax
ids do. Observations are float32 (MinAtar's 10x10xC channels of 0/1 included); one-dimensional
continuous actions are passed as the scalar the classic-control envs expect.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from typing import Any, NamedTuple

import numpy as np

from fastpop.envs.errors import UnknownEnvironment, close_names, missing_extra
from fastpop.types import DeviceEnv, EnvSpec

PREFIX = "gymnax/"
EXTRA, PACKAGE = "gymnax", "gymnax"
LIBRARIES = ("gymnax",)  # whose versions key stored programs (device_envs.family_libraries)
BACKENDS = ()  # one implementation: `backend` is refused (device_envs.resolve_backend)
INSTALL = f"pip install -e '.[{EXTRA}]'"
PROBE_ID = "gymnax/CartPole-v1"  # what `fastpop doctor` builds to check the family
# The ids fastpop trains: classic control and MinAtar (bsuite and misc envs are left out: bandits
# and memory tasks with observation or action spaces these agents do not take).
NAMES = (
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "Breakout-MinAtar",
    "SpaceInvaders-MinAtar",
    "Asterix-MinAtar",
    "Freeway-MinAtar",
)
CONTINUOUS = frozenset({"Pendulum-v1", "MountainCarContinuous-v0"})
# gymnasium's own id of the same task, where it has one (MinAtar's are not in gymnasium).
COUNTERPARTS = {name: name for name in NAMES[:5]}
NO_TIME_LIMIT = 2**30


class GymnaxState(NamedTuple):
    env: Any  # gymnax's EnvState
    obs: Any
    reward: Any  # float32
    done: Any  # bool: a termination
    key: Any  # gymnax steps take a key: carried per lane


def check_id(env_id: str) -> str:
    """The id as registered, or UnknownEnvironment with close names, or MissingExtra."""
    name = env_id[len(PREFIX) :]
    by_key = {known.lower(): known for known in NAMES}
    if name.lower() not in by_key:
        hint = close_names(name.lower(), by_key, PREFIX)
        known = ", ".join(PREFIX + known for known in NAMES)
        raise UnknownEnvironment(f"{env_id}: unknown gymnax environment; {hint}Known: {known}")
    if not gymnax_installed():
        raise missing_extra(env_id, "gymnax", INSTALL)
    return PREFIX + by_key[name.lower()]


def gymnax_installed() -> bool:
    return importlib.util.find_spec("gymnax") is not None


def discrete_actions(env_id: str) -> bool:
    return env_id[len(PREFIX) :] not in CONTINUOUS


def counterpart(env_id: str) -> str | None:
    return COUNTERPARTS.get(env_id[len(PREFIX) :])


def default_episode_length(env_id: str) -> int:
    return int(_gymnax(env_id)[1].max_steps_in_episode)


@functools.cache
def _gymnax(env_id: str):
    import gymnax

    if env_id.endswith("-MinAtar"):
        # gymnax 0.0.9's MinAtar games set int and float values into boolean arrays, which JAX
        # warns at every trace will one day be an error: the pinned gymnax's to mend, not a
        # user's (a JAX that refuses them fails tests/test_gymnax.py's MinAtar cases).
        warnings.filterwarnings(
            "ignore", "scatter inputs have incompatible types", FutureWarning, "jax"
        )
    return gymnax.make(env_id[len(PREFIX) :])


@functools.cache
def make(env_id: str, backend: str | None = None) -> DeviceEnv:
    """`env_id`'s DeviceEnv (checked, canonical); gymnax has no backends (`backend` is None)."""
    import jax
    import jax.numpy as jnp

    del backend  # BACKENDS is (): config.env.backend is refused for this family
    env, params = _gymnax(env_id)
    episode_length = int(params.max_steps_in_episode)
    params = params.replace(max_steps_in_episode=NO_TIME_LIMIT)
    spec = _spec(env, params)
    scalar_action = not spec.discrete and spec.action_dim == 1

    def reset(key):
        key, reset_key = jax.random.split(key)
        obs, state = env.reset_env(reset_key, params)
        return GymnaxState(state, obs.astype(jnp.float32), jnp.float32(0), jnp.bool_(False), key)

    def step(state: GymnaxState, action):
        key, step_key = jax.random.split(state.key)
        action = action[0] if scalar_action else action
        obs, env_state, reward, done, _ = env.step_env(step_key, state.env, action, params)
        reward = jnp.asarray(reward, jnp.float32).reshape(())
        return GymnaxState(env_state, obs.astype(jnp.float32), reward, done.reshape(()), key)

    return DeviceEnv(reset, step, spec, episode_length)


def _spec(env, params) -> EnvSpec:
    obs_shape = tuple(int(n) for n in env.observation_space(params).shape)
    space = env.action_space(params)
    if hasattr(space, "n"):
        return EnvSpec(obs_shape, np.dtype(np.float32), num_actions=int(space.n))
    return EnvSpec(
        obs_shape,
        np.dtype(np.float32),
        action_dim=int(np.prod(space.shape)),
        action_low=float(np.min(space.low)),
        action_high=float(np.max(space.high)),
    )

"""Shared types: the replay row, environment specs and the population axis name.

Importing this module does not import JAX: collector processes read `EnvSpec` through the envs
package and never need JAX during their warm-up (`PRNGKey` imports it when first asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import jax

# The named vmap axis over population members. Collectives over it (e.g. "is any member due
# for an actor step?") are how a member-level function cooperates with its population.
POP_AXIS = "pop"

PyTree = Any


def __getattr__(name: str):
    if name == "PRNGKey":  # jax.Array, without importing JAX for those who never use it
        import jax

        return jax.Array
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class EnvSpec(NamedTuple):
    """Static shapes of an environment, all an agent needs to build its networks.

    `obs_shape`/`obs_dtype` describe one observation as the agent sees it (for Atari the
    stacked 84x84x4 uint8 frames). Continuous control sets `action_dim` and the bounds;
    discrete control sets `num_actions`. `policy_obs_size` > 0 splits a vector observation for
    an asymmetric actor-critic: the actor sees its first `policy_obs_size` entries (what a
    policy may observe), the critics the rest (the simulator's privileged state).
    """

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype = np.dtype(np.float32)
    action_dim: int = 0
    action_low: float = -1.0
    action_high: float = 1.0
    num_actions: int = 0
    # Number of frames stacked on the last observation axis (Atari: 4). Replay stores each
    # frame once and rebuilds stacks when sampling.
    frame_stack: int = 1
    policy_obs_size: int = 0  # 0: the actor and the critics see the whole observation

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def actor_observes(self) -> tuple[int | None, int | None]:
        """The slice of a vector observation the actor sees (all of it: (None, None))."""
        return (None, self.policy_obs_size or None)

    @property
    def critic_observes(self) -> tuple[int | None, int | None]:
        """The slice of a vector observation the critics see (all of it: (None, None))."""
        return (self.policy_obs_size or None, None)


def stored_obs(spec, obs):
    """Slices (stacked) observations to the stored layout: only the newest frame of a stack.
    `spec`: anything with `obs_shape` and `frame_stack` (an EnvSpec, a replay spec, a
    collector's row layout)."""
    if spec.frame_stack == 1:
        return obs
    return obs[..., -(spec.obs_shape[-1] // spec.frame_stack) :]


# `agent.observation_norm` (fastpop/agents/observation_norm.py): the published policy params
# hold a member's observation statistics under this key, {"mean": (obs_dim,), "var": (obs_dim,)},
# beside its network's ("params"); every consumer normalizes with `normalized_observation`.
OBSERVATION_NORM_KEY = "observation_norm"
OBSERVATION_NORM_EPSILON = 1e-8  # keeps a constant feature (variance 0) finite
OBSERVATION_NORM_CLIP = 10.0  # normalized features beyond +-10 standard deviations are clipped


def normalized_observation(obs, mean, var, xp):
    """clip((obs - mean) / sqrt(var + 1e-8), -10, 10): the one formula of `agent.observation_norm`,
    in `xp` (jax.numpy in the agents' programs, numpy in a collector without JAX), so that
    every path applies it alike. `obs`: float32 (uint8 scaled to [0, 1] first)."""
    scale = xp.sqrt(var + np.float32(OBSERVATION_NORM_EPSILON))
    clip = np.float32(OBSERVATION_NORM_CLIP)
    return xp.clip((obs - mean) / scale, -clip, clip)


class DeviceEnv(NamedTuple):
    """An environment stepped inside jit, whatever simulator family it comes from (adapters:
    fastpop/envs/device_envs.py). `reset(key) -> state` and `step(state, action) -> state` are
    pure; the rollout reads `state.obs`, `state.reward` and `state.done`, a termination only:
    the time limit (`episode_length` by default) and autoreset are the rollout's."""

    reset: Callable[[jax.Array], Any]
    step: Callable[[Any, jax.Array], Any]
    spec: EnvSpec
    episode_length: int


class Transition(NamedTuple):
    """A batch of (s, a, r, s') transitions as the agents' `update` consumes them.

    `terminated` masks the bootstrap; `truncated` (a time limit) does not, it is kept so that
    losses and diagnostics can tell the two apart. An n-step transition (`agent.n_step` > 1)
    spans `steps` env steps: `reward` is then (batch, n) (zero past `steps`), `next_obs` the
    observation after its last step, and the flags those of its last step.
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    steps: jax.Array | None = None  # (batch,) int32 env steps spanned; None: one each


def population_any(flag: jax.Array) -> jax.Array:
    """True if `flag` holds for any member when called inside `vmap(axis_name=POP_AXIS)`.

    Outside a population (one member, sequential execution) it is the flag itself. The result
    is unbatched under vmap, so a `lax.cond` on it runs one branch for the whole population
    instead of both branches for every member.
    """
    import jax

    try:
        return jax.lax.pmax(flag.astype(np.int32), POP_AXIS).astype(bool)
    except NameError:
        return flag

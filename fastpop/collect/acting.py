"""How a collector picks the exploring actions of all its slots, one batched call per env step.

`JaxActing` runs the agent's own `act`, vmapped over slots and jitted: any agent and observation
type. For MLP policies (TD3, SAC, DQN) on vector observations the collector acts in numpy instead,
without importing JAX (`collect/numpy_policy.py`); `numpy_policy_for` decides, in the learner's
process, and describes that policy as plain data.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.agents import registry
from fastpop.agents.networks import GaussianActor
from fastpop.collect.numpy_policy import KeyPath, NumpyPolicy
from fastpop.types import OBSERVATION_NORM_KEY, EnvSpec

# Up to here the slots' actor weights stay in cache. Beyond, numpy streams them from memory slot
# by slot and XLA's batched dots win: 16 HalfCheetah slots (256-256, 4.5 MiB) took 350 us per
# step jitted against 540 us in numpy; 4 slots 120 us against 60 us (results/bench/README.md).
NUMPY_MAX_POLICY_BYTES = 2 * 2**20


def batched_policy_step(agent, num_slots: int, envs_per_member: int):
    """One call per env step: next key, and an exploring action for every slot (one env each);
    for an agent that reads episode draws (`Agent.episode_draws`), the slots' `draws` (slots,)
    too, made anew where `new_episodes` (bool, slots,) before acting (None for the others).

    Splitting keys inside the compiled call keeps it to one dispatch per step.
    """
    step = population.policy_step(agent, num_slots, envs_per_member)

    def slots_step(policy, obs, key, hparams, env_steps_per_env, draws=None, new_episodes=None):
        if draws is not None:
            key, draw_key = jax.random.split(key)
            draws = jnp.where(new_episodes, jax.random.uniform(draw_key, draws.shape), draws)
        episode_draws = None if draws is None else draws[:, None]
        actions, key = step(policy, obs[:, None], key, hparams, env_steps_per_env, episode_draws)
        return actions[:, 0], key, draws

    return slots_step


class JaxActing:
    """The agent's jitted `act`: any agent and observation type. Where the agent reads episode
    draws, it keeps each slot's, made anew at its episodes' starts (`__call__`)."""

    def __init__(self, agent, num_slots: int, envs_per_member: int, key):
        self._step = jax.jit(batched_policy_step(agent, num_slots, envs_per_member))
        self._key, self._policy, self._hparams = key, None, None
        # Each slot's episode draw where the agent reads them: all made at the first call
        self._draws = np.zeros(num_slots, np.float32) if agent.episode_draws else None
        self._fresh = True

    def set_policy(self, policy, hparams) -> None:
        self._policy, self._hparams = jax.device_put((policy, hparams))  # once per version

    def __call__(self, obs: np.ndarray, env_steps, new_episodes=None) -> np.ndarray:
        """`env_steps`: per env so far, of each slot's trial (an array, or one for all);
        `new_episodes`: bool (slots,), the slots whose episode starts at this step or ended
        since the last call (their episode draws are made anew), or None."""
        steps = np.broadcast_to(np.asarray(env_steps, np.int32), (len(obs),))
        draws = ()
        if self._draws is not None:
            fresh = np.ones(len(obs), bool) if self._fresh else new_episodes
            fresh = np.zeros(len(obs), bool) if fresh is None else np.asarray(fresh, bool)
            draws, self._fresh = (self._draws, fresh), False
        actions, self._key, new_draws = self._step(
            self._policy, obs, self._key, self._hparams, steps, *draws
        )
        self._draws = new_draws
        return np.asarray(actions)


def leaf_paths(tree) -> tuple[KeyPath, ...]:
    """The key path of each leaf of `tree`, in leaf order, as plain dict keys, sequence indices
    and attribute names (what `numpy_policy.nested` rebuilds the tree from without JAX)."""

    def plain(key):
        for field in ("key", "idx", "name"):  # DictKey, SequenceKey / FlattenedIndexKey, GetAttr
            if hasattr(key, field):
                return getattr(key, field)
        raise TypeError(f"no plain form for the tree key {key!r}")

    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    return tuple(tuple(plain(key) for key in path) for path, _ in with_paths)


def numpy_policy_for(
    algo: str,
    spec: EnvSpec,
    published,
    num_slots: int,
    envs_per_member: int,
    exploration_std_min: float | None = None,
) -> NumpyPolicy | None:
    """What a collector of `num_slots` slots needs to act in numpy, from the published tree
    (stacked policy params, hparams, env steps: arrays or shapes); None where the jitted `act`
    serves it: image observations, networks of other layers than Dense (convolutions, residual
    blocks' LayerNorms), or slots whose weights outgrow the cache. `exploration_std_min`: the
    config's agent.exploration_std_min, where it has one (the deterministic kind's per-episode
    noise)."""
    entry = registry.get(algo)
    if entry.numpy_policy is None or len(spec.obs_shape) != 1 or spec.policy_obs_size:
        return None  # (an asymmetric actor reads a slice of the observation)
    paths = leaf_paths(published)
    if not all(_numpy_policy_leaf(path[1:], entry.policy_torso) for path in paths if path[0] == 0):
        return None  # an actor of other layers than NumpyActing computes
    params = jax.tree.leaves(published[0])
    member_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in params) // params[0].shape[0]
    if num_slots * member_bytes > NUMPY_MAX_POLICY_BYTES:
        return None
    bounds = (GaussianActor.log_std_min, GaussianActor.log_std_max)
    low, high = spec.action_low, spec.action_high
    return NumpyPolicy(
        *(entry.numpy_policy, envs_per_member, low, high, bounds, paths),
        torso=entry.policy_torso,
        hparam_names=entry.numpy_hparam_names(),
        exploration_std_min=exploration_std_min,
    )


def _numpy_policy_leaf(path: KeyPath, torso: str) -> bool:
    """Whether an actor param's path is a Dense layer's kernel or bias, in the actor or in its
    MLP (`torso`, the entry's): ("params", "MLP_0", "Dense_1", "kernel"), ("params", "Dense_0",
    "bias"); or one of the observation statistics published beside them
    (agent.observation_norm), which NumpyActing applies: ("observation_norm", "mean")."""
    if path in ((OBSERVATION_NORM_KEY, "mean"), (OBSERVATION_NORM_KEY, "var")):
        return True
    *modules, leaf = path
    if not modules or modules[0] != "params" or leaf not in ("kernel", "bias"):
        return False
    return all(m == torso or str(m).startswith("Dense_") for m in modules[1:])

"""How a collector picks the exploring actions of all its slots, one batched call per env step.

`JaxActing` runs the agent's own `act`, vmapped over slots and jitted. Next to a fast simulator
its cost is mostly the dispatch of that call (and, on a busy CPU, the hand-off to XLA's thread),
so for MLP actors (TD3, SAC) `NumpyActing` does the same arithmetic in numpy on the collector's
own thread. Its random numbers are still JAX's: the same key chain as `JaxActing` (per step
`key, act_key = split(key)`, one key per slot from `split(act_key, slots)`), drawn for a block
of steps in one compiled call, so both produce the same actions up to float rounding (tested).
Both take the slots' policy parameters and hparams (leading axis: slot) from `set_policy`.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from fastpop import population
from fastpop.agents.networks import GaussianActor
from fastpop.types import EnvSpec

BLOCK_STEPS = 256  # env steps of noise drawn per compiled call
NUMPY_ALGORITHMS = ("td3", "sac")
# Up to here the slots' actor weights stay in cache. Beyond, numpy streams them from memory slot
# by slot and XLA's batched dots win: 16 HalfCheetah slots (256-256, 4.5 MiB) took 350 us per
# step jitted against 540 us in numpy; 4 slots 120 us against 60 us (results/bench/README.md).
NUMPY_MAX_POLICY_BYTES = 2 * 2**20


def batched_policy_step(agent, num_slots: int, envs_per_member: int):
    """One call per env step: next key, and an exploring action for every slot.

    Splitting keys inside the compiled call keeps it to one dispatch per step.
    """
    act = population.population_act(agent)

    def step(policy, obs, key, hparams, env_steps_per_env):
        key, act_key = jax.random.split(key)
        keys = jax.random.split(act_key, num_slots)
        member_steps = env_steps_per_env * envs_per_member
        actions = act(policy, obs[:, None], keys, hparams, True, member_steps)
        return actions[:, 0], key

    return step


class JaxActing:
    """The agent's jitted `act`: any agent and observation type."""

    def __init__(self, agent, num_slots: int, envs_per_member: int, key):
        self._step = jax.jit(batched_policy_step(agent, num_slots, envs_per_member))
        self._key, self._policy, self._hparams = key, None, None

    def set_policy(self, policy, hparams) -> None:
        self._policy, self._hparams = jax.device_put((policy, hparams))  # once per version

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        actions, self._key = self._step(
            self._policy, obs, self._key, self._hparams, np.int32(env_steps)
        )
        return np.asarray(actions)


def _normal_block(key, *, num_slots: int, action_dim: int, steps: int):
    """(key after `steps` steps, the standard normals (steps, slots, action_dim) the agents'
    `act` draws in those steps: `normal(slot_key, (1, action_dim))` per slot)."""

    def step(key, _):
        key, act_key = jax.random.split(key)
        keys = jax.random.split(act_key, num_slots)
        return key, jax.vmap(lambda k: jax.random.normal(k, (1, action_dim))[0])(keys)

    return jax.lax.scan(step, key, None, length=steps)


def _dense_layers(module: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """(kernel (slots, in, out), bias (slots, 1, out)) of a flax module's `Dense_<i>` layers."""
    names = sorted((n for n in module if n.startswith("Dense_")), key=lambda n: int(n[6:]))
    return [
        (np.asarray(module[n]["kernel"], np.float32), np.asarray(module[n]["bias"], np.float32))
        for n in names
    ]


def _mlp(layers, x: np.ndarray, activate_final: bool) -> np.ndarray:
    """`networks.MLP` on (slots, 1, in) inputs, one weight set per slot."""
    for i, (kernel, bias) in enumerate(layers):
        x = np.matmul(x, kernel)
        x += bias[:, None, :]
        if activate_final or i < len(layers) - 1:
            np.maximum(x, 0.0, out=x)
    return x


class NumpyActing:
    """TD3's or SAC's exploring action (`agents/td3.py`, `agents/sac.py`: `act` with
    explore=True) for vector observations, in numpy."""

    def __init__(self, algo: str, spec: EnvSpec, num_slots: int, key, block_steps=BLOCK_STEPS):
        if algo not in NUMPY_ALGORITHMS or len(spec.obs_shape) != 1:
            raise ValueError(f"no numpy policy for {algo} with observations {spec.obs_shape}")
        self.algo, self.block_steps = algo, block_steps
        self.half_range = (spec.action_high - spec.action_low) / 2.0
        self.center = (spec.action_high + spec.action_low) / 2.0
        self.low, self.high = spec.action_low, spec.action_high
        self._draw = jax.jit(
            functools.partial(
                _normal_block, num_slots=num_slots, action_dim=spec.action_dim, steps=block_steps
            )
        )
        self._key, self._normals, self._used = key, None, block_steps
        self._torso = self._heads = self._noise_scale = None

    def set_policy(self, policy, hparams) -> None:
        params = policy["params"]
        self._torso = _dense_layers(params["MLP_0"])
        if self.algo == "sac":  # GaussianActor: ReLU torso, then mean and log-std heads
            self._heads = _dense_layers(params)
        else:  # DeterministicActor: one MLP, the last layer linear; acting noise per slot
            scale = np.asarray(hparams.exploration_noise, np.float32) * self.half_range
            self._noise_scale = scale[:, None]

    def _next_normals(self) -> np.ndarray:
        if self._used == self.block_steps:
            self._key, normals = self._draw(self._key)
            self._normals, self._used = np.asarray(normals), 0
        self._used += 1
        return self._normals[self._used - 1]

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        del env_steps  # neither TD3 nor SAC schedules its exploration
        normal = self._next_normals()
        x = np.asarray(obs, np.float32)[:, None, :]
        if self.algo == "td3":
            action = np.tanh(_mlp(self._torso, x, activate_final=False)[:, 0])
            action = action * self.half_range + self.center
            return np.clip(action + self._noise_scale * normal, self.low, self.high)
        x = _mlp(self._torso, x, activate_final=True)
        (mean_kernel, mean_bias), (log_std_kernel, log_std_bias) = self._heads
        mean = np.matmul(x, mean_kernel)[:, 0] + mean_bias
        log_std = np.matmul(x, log_std_kernel)[:, 0] + log_std_bias
        log_std = np.clip(log_std, GaussianActor.log_std_min, GaussianActor.log_std_max)
        return np.tanh(mean + np.exp(log_std) * normal) * self.half_range + self.center


def policy_bytes(agent) -> int:
    """Bytes of one member's policy parameters."""
    state = jax.eval_shape(agent.init, jax.random.key(0), agent.default_hparams())
    leaves = jax.tree.leaves(jax.eval_shape(agent.policy_params, state))
    return sum(leaf.size * leaf.dtype.itemsize for leaf in leaves)


def make_acting(algo: str, agent, spec: EnvSpec, num_slots: int, envs_per_member: int, key):
    """`NumpyActing` where it applies and is faster, else `JaxActing`."""
    supported = algo in NUMPY_ALGORITHMS and len(spec.obs_shape) == 1
    if supported and num_slots * policy_bytes(agent) <= NUMPY_MAX_POLICY_BYTES:
        return NumpyActing(algo, spec, num_slots, key)
    return JaxActing(agent, num_slots, envs_per_member, key)

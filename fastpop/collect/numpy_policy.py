"""TD3's and SAC's exploring actors in numpy, for a collector that never imports JAX.

A collector's slots act with one batched call per env step. Next to a fast simulator a jitted
call costs mostly its dispatch, so for MLP actors with vector observations `NumpyActing` does
the agents' arithmetic (`agents/td3.py`, `agents/sac.py`: `act` with explore=True) in numpy on
the collector's own thread, and draws its exploration noise from numpy's generator: importing
JAX and building the agent took ~1.2-1.5 s of CPU and ~220 MiB per collector
(results/startup/README.md, "Collectors without JAX for good"). What it needs from the learner
crosses the spawn boundary as plain data (`NumpyPolicy`, made by `collect/acting.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

ALGORITHMS = ("td3", "sac")

KeyPath = tuple[str | int, ...]


class NumpyPolicy(NamedTuple):
    """How a collector acts without JAX: the algorithm, the actions' size and bounds, SAC's
    log-std bounds, and the key path of every published leaf (`acting.numpy_policy_for` makes
    it)."""

    algo: str
    action_dim: int
    action_low: float
    action_high: float
    log_std_bounds: tuple[float, float]
    leaf_paths: tuple[KeyPath, ...]  # (0, "params", "MLP_0", "Dense_0", "kernel"), ...


def nested(paths: Sequence[KeyPath], leaves: Sequence[Any]) -> dict:
    """The published leaves as nested dicts keyed by their paths' keys (the published tree is
    (policy params, hparams, env steps): keys 0, 1 and 2 at the top)."""
    tree: dict = {}
    for path, leaf in zip(paths, leaves, strict=True):
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf
    return tree


def slots_policy(policy: NumpyPolicy, rows: np.ndarray) -> Callable[[Sequence[Any]], tuple]:
    """From the published leaves of a collector's members: its slots' (actor params, hparams),
    slot s taking row `rows[s]` of every leaf."""

    def take(tree: dict) -> dict:
        return {k: take(v) if isinstance(v, dict) else v[rows] for k, v in tree.items()}

    def from_leaves(leaves: Sequence[Any]) -> tuple[dict, dict]:
        published = nested(policy.leaf_paths, leaves)
        return take(published[0]), take(published[1])

    return from_leaves


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


def standard_normals(seed: int, shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
    """Each call: the next step's float32 standard normals of `shape` (slots, action_dim), one
    stream per seed (a collector's env seed)."""
    generator = np.random.default_rng([seed, 0xAC7])
    return lambda: generator.standard_normal(shape, dtype=np.float32)


class NumpyActing:
    """TD3's or SAC's exploring action for a collector's slots (each slot: its member's
    policy), in numpy. `normals`: the next step's standard normals (`standard_normals`)."""

    def __init__(self, policy: NumpyPolicy, normals: Callable[[], np.ndarray]):
        if policy.algo not in ALGORITHMS:
            raise ValueError(f"no numpy policy for {policy.algo}: only {', '.join(ALGORITHMS)}")
        self.algo, self.normals = policy.algo, normals
        self.low, self.high = policy.action_low, policy.action_high
        self.half_range = (policy.action_high - policy.action_low) / 2.0
        self.center = (policy.action_high + policy.action_low) / 2.0
        self.log_std_min, self.log_std_max = policy.log_std_bounds
        self._torso = self._heads = self._noise_scale = None

    def set_policy(self, params: dict, hparams: dict) -> None:
        """params: the slots' actor params ({"params": {"MLP_0": ...}}, leading axis: slot);
        hparams: their hparams by name."""
        params = params["params"]
        self._torso = _dense_layers(params["MLP_0"])
        if self.algo == "sac":  # GaussianActor: ReLU torso, then mean and log-std heads
            self._heads = _dense_layers(params)
        else:  # DeterministicActor: one MLP, the last layer linear; acting noise per slot
            scale = np.asarray(hparams["exploration_noise"], np.float32) * self.half_range
            self._noise_scale = scale[:, None]

    def __call__(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        del env_steps  # neither TD3 nor SAC schedules its exploration
        normal = self.normals()
        x = np.asarray(obs, np.float32)[:, None, :]
        if self.algo == "td3":
            action = np.tanh(_mlp(self._torso, x, activate_final=False)[:, 0])
            action = action * self.half_range + self.center
            return np.clip(action + self._noise_scale * normal, self.low, self.high)
        x = _mlp(self._torso, x, activate_final=True)
        (mean_kernel, mean_bias), (log_std_kernel, log_std_bias) = self._heads
        mean = np.matmul(x, mean_kernel)[:, 0] + mean_bias
        log_std = np.matmul(x, log_std_kernel)[:, 0] + log_std_bias
        log_std = np.clip(log_std, self.log_std_min, self.log_std_max)
        return np.tanh(mean + np.exp(log_std) * normal) * self.half_range + self.center

"""Exploring MLP policies in numpy, for a collector that never imports JAX.

A collector's slots act with one batched call per env step. Next to a fast simulator a jitted
call costs mostly its dispatch, so for MLP networks on vector observations `NumpyActing` does
the agents' arithmetic (their `act` with explore=True; an algorithm's registry entry names
its kind: `AlgorithmEntry.numpy_policy`) in numpy on the collector's own thread, and draws its
exploration's random numbers from numpy's generator: importing JAX and building the agent
took ~1.2-1.5 s of CPU and ~220 MiB per collector
(results/startup/README.md, "Collectors without JAX for good"). What it needs from the learner
crosses the spawn boundary as plain data (`NumpyPolicy`, made by `collect/acting.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from fastpop.types import OBSERVATION_NORM_KEY, normalized_observation

# How each kind acts: "deterministic" a tanh MLP actor plus Gaussian noise of std
# exploration_noise (TD3's; with exploration_std_min, each slot's std drawn between the two at
# each of its episodes' starts), "squashed_gaussian" tanh of a sample of mean and log-std heads
# (SAC's), "epsilon_greedy" a uniform random action with probability epsilon, else argmax Q
# (DQN's). What each reads of an algorithm's params and hparams, its registry entry names
# (`agents/base.AlgorithmEntry.policy_torso`, `.numpy_hparams`; the hparams' roles:
# `agents/base.NUMPY_POLICY_HPARAMS`), checked when it is registered; `NumpyPolicy` brings them.
KINDS = ("deterministic", "squashed_gaussian", "epsilon_greedy")

KeyPath = tuple[str | int, ...]


class NumpyPolicy(NamedTuple):
    """How a collector acts without JAX: the policy's kind (one of KINDS), its envs per member,
    the action bounds, a squashed Gaussian's log-std bounds, the key path of every published
    leaf, and what the kind reads of the algorithm's params and hparams, as its registry entry
    names them (`acting.numpy_policy_for` makes it)."""

    kind: str
    envs_per_member: int  # epsilon_greedy's epsilon: a member's env steps = a slot's x this
    action_low: float
    action_high: float
    log_std_bounds: tuple[float, float]
    leaf_paths: tuple[KeyPath, ...]  # (0, "params", "MLP_0", "Dense_0", "kernel"), ...
    torso: str  # the module of the policy params' "params" holding its MLP: "MLP_0"
    hparam_names: dict[str, str]  # role -> the algorithm's hparam: {"exploration_noise": ...}
    # The deterministic kind's per-episode noise (agent.exploration_std_min); None: none
    exploration_std_min: float | None = None


def nested(paths: Sequence[KeyPath], leaves: Sequence[Any]) -> dict:
    """The published leaves as nested dicts keyed by their paths' keys (the published tree is
    (policy params, hparams, trial clocks): keys 0, 1 and 2 at the top)."""
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


def _float_observation(obs: np.ndarray) -> np.ndarray:
    """`networks.as_float_observation`: uint8 observations (Atari RAM) scaled to [0, 1]."""
    if obs.dtype == np.uint8:
        return obs.astype(np.float32) / np.float32(255.0)
    return obs.astype(np.float32)


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


def exploration_generator(seed: int) -> np.random.Generator:
    """The exploration noise's random numbers of a collector: one stream per seed (its env
    seed), apart from the env's own."""
    return np.random.default_rng([seed, 0xAC7])


class NumpyActing:
    """The exploring action of a policy kind (TD3's, SAC's, DQN's) for a collector's slots (each
    slot: its member's policy), in numpy. `rng`: the exploration's random numbers
    (`exploration_generator`). `explore=False`: the deterministic action instead, the agents'
    `act(..., explore=False)` (the evaluator's: TD3's actor, SAC's squashed mean, DQN's argmax);
    it draws no random numbers."""

    def __init__(self, policy: NumpyPolicy, rng: np.random.Generator, explore: bool = True):
        if policy.kind not in KINDS:
            raise ValueError(f"no numpy policy for {policy.kind}: only {', '.join(KINDS)}")
        self.policy, self.rng, self.explore = policy, rng, explore
        self.half_range = (policy.action_high - policy.action_low) / 2.0
        self.center = (policy.action_high + policy.action_low) / 2.0
        self._torso = self._heads = self._hparams = self._noise_scale = None
        self._observation_norm: tuple[np.ndarray, np.ndarray] | None = None
        self._episode_draws: np.ndarray | None = None  # per slot, with exploration_std_min

    def set_policy(self, params: dict, hparams: dict) -> None:
        """params: the slots' actor params ({"params": {policy.torso: ...}}, leading axis:
        slot, and with agent.observation_norm their statistics, {"observation_norm": {"mean",
        "var"}}); hparams: their hparams by name (those of `policy.hparam_names` are read)."""
        norm = params.get(OBSERVATION_NORM_KEY)
        if norm is not None:  # (slots, 1, obs_dim), as the observations are shaped
            self._observation_norm = tuple(
                np.asarray(norm[name], np.float32)[:, None, :] for name in ("mean", "var")
            )
        params = params["params"]
        self._torso = _dense_layers(params[self.policy.torso])
        # SAC's mean and log-std heads; DQN's action values, or with a dueling head its
        # advantages then value (Dense_0, Dense_1): Q = V + A - mean(A) differs from A by a
        # per-state constant, so the argmax of the advantages is Q's (agents/networks.QNetwork).
        self._heads = _dense_layers(params)
        # by role: the kind's names, whatever the algorithm names them
        names = self.policy.hparam_names.items()
        self._hparams = {role: np.asarray(hparams[name]) for role, name in names}
        if self.policy.kind == "deterministic":  # its noise per slot, fixed until the next policy
            noise = self._hparams["exploration_noise"].astype(np.float32) * self.half_range
            self._noise_scale = noise[:, None]

    def __call__(self, obs: np.ndarray, env_steps, new_episodes=None) -> np.ndarray:
        """`env_steps`: per env so far, of each slot's trial (an array, or one for all): DQN's
        epsilon decays over its member's trial's env steps. `new_episodes`: bool (slots,), the
        slots whose episode starts at this step or ended since the last call, or None: with
        exploration_std_min their noise std is drawn anew."""
        x = _float_observation(np.asarray(obs)).reshape(len(obs), 1, -1)
        if self._observation_norm is not None:  # the agents' `act`, with the same formula
            x = normalized_observation(x, *self._observation_norm, np)
        if self.policy.kind == "deterministic":  # one MLP, its last layer linear
            return self._deterministic(x, new_episodes)
        x = _mlp(self._torso, x, activate_final=True)
        heads = [np.matmul(x, kernel)[:, 0] + bias for kernel, bias in self._heads]
        if self.policy.kind == "squashed_gaussian":  # GaussianActor: mean and log-std heads
            return self._squashed_gaussian(*heads)
        if not self.explore:
            return heads[0].argmax(-1).astype(np.int32)
        return self._epsilon_greedy(heads[0], env_steps * self.policy.envs_per_member)

    def _deterministic(self, x: np.ndarray, new_episodes) -> np.ndarray:
        action = np.tanh(_mlp(self._torso, x, activate_final=False)[:, 0])
        action = action * self.half_range + self.center
        if not self.explore:
            return np.clip(action, self.policy.action_low, self.policy.action_high)
        noise = self._noise_std(len(x), new_episodes) * self._normals(action.shape)
        return np.clip(action + noise, self.policy.action_low, self.policy.action_high)

    def _noise_std(self, slots: int, new_episodes) -> np.ndarray:
        """(slots, 1): exploration_noise's, or with exploration_std_min each slot's, uniform
        between the two, drawn at its episodes' starts (agents/td3.py's `per_episode_std`)."""
        std_min = self.policy.exploration_std_min
        if std_min is None:
            return self._noise_scale
        if self._episode_draws is None:  # the first call: every slot's first draw
            self._episode_draws = self.rng.random(slots, dtype=np.float32)
        elif new_episodes is not None and np.any(new_episodes):
            fresh = self.rng.random(slots, dtype=np.float32)
            self._episode_draws = np.where(new_episodes, fresh, self._episode_draws)
        std_max = self._hparams["exploration_noise"].astype(np.float32)
        std = std_min + self._episode_draws * (std_max - std_min)
        return (std * self.half_range)[:, None]

    def _squashed_gaussian(self, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
        if not self.explore:
            return np.tanh(mean) * self.half_range + self.center
        log_std = np.clip(log_std, *self.policy.log_std_bounds)
        pre_tanh = mean + np.exp(log_std) * self._normals(mean.shape)
        return np.tanh(pre_tanh) * self.half_range + self.center

    def _epsilon_greedy(self, values: np.ndarray, member_steps: int) -> np.ndarray:
        """agents/dqn.py's `act`: a uniform random action with probability epsilon (decaying
        linearly over the member's env steps), else the greedy one."""
        h = self._hparams
        decay = np.maximum(h["epsilon_decay_steps"], 1)
        fraction = np.clip(member_steps / decay, 0.0, 1.0)
        epsilon = h["epsilon_start"] + fraction * (h["epsilon_end"] - h["epsilon_start"])
        slots = len(values)
        random_action = self.rng.integers(0, values.shape[-1], slots)
        take_random = self.rng.random(slots, dtype=np.float32) < epsilon
        return np.where(take_random, random_action, values.argmax(-1)).astype(np.int32)

    def _normals(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32)

"""Flax networks for one member: MLP, residual (SimBa), hyperspherical (SimbaV2:
agents/hyperspherical.py) and Nature-CNN torsos, actor and critic heads.

Every module maps a batch of observations (B, *obs_shape) to a batch of outputs; the
population axis is added by vmap over parameters, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from fastpop.agents.hyperspherical import SimbaV2MLP, check_residual_widths
from fastpop.agents.mlp_kernels import XLA_KERNELS, MLPKernel, check_mlp_kernel, fused_layers


def as_float_observation(obs: jax.Array) -> jax.Array:
    """Images are stored and shipped as uint8; scale them here, inside the compiled network."""
    if obs.dtype == jnp.uint8:
        return obs.astype(jnp.float32) / 255.0
    return obs.astype(jnp.float32)


COMPUTE_DTYPES = ("float32", "bfloat16")


def output_layer_init(std: float | None) -> dict:
    """nn.Dense's initializers of an output layer: N(0, std^2) weights and zero biases
    (FastTD3's actor: std 0.01, its first actions near the action range's middle); None:
    flax's defaults."""
    if std is None:
        return {}
    return {"kernel_init": nn.initializers.normal(std), "bias_init": nn.initializers.zeros}


class MLP(nn.Module):
    """Dense ReLU layers; the last layer has no activation unless `activate_final`. Parameters
    are float32; `dtype` is what the matmuls compute in (outputs come back as float32).
    `output_init_std`: the last layer's initial weights' std (`output_layer_init`). `kernel`:
    what computes the layers (`MLPKernel`; pallas: no `layer_norm`)."""

    layer_sizes: Sequence[int]
    activate_final: bool = False
    layer_norm: bool = False
    dtype: str = "float32"
    output_init_std: float | None = None
    kernel: MLPKernel = XLA_KERNELS

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_mlp_kernel(self.kernel, self.layer_norm)
        if self.kernel.name == "pallas":
            output_init = output_layer_init(self.output_init_std)
            return fused_layers(
                x,
                self.layer_sizes,
                self.activate_final,
                self.dtype,
                output_init,
                self.kernel,
                self.is_initializing(),
            )
        for i, size in enumerate(self.layer_sizes):
            is_last = i == len(self.layer_sizes) - 1
            init = output_layer_init(self.output_init_std) if is_last else {}
            x = nn.Dense(size, dtype=self.dtype, param_dtype=jnp.float32, **init)(x)
            if not is_last or self.activate_final:
                if self.layer_norm:
                    x = nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)(x)
                x = nn.relu(x)
        return x.astype(jnp.float32)


NETWORKS = ("mlp", "residual", "simbav2")


class ResidualMLP(nn.Module):
    """SimBa's residual torso (Lee et al., 2024; v1, without SimbaV2's hyperspherical
    normalization): a linear layer to the blocks' width h, then one pre-LayerNorm residual block
    per hidden size, x + Dense(h)(relu(Dense(4h)(LayerNorm(x)))), and a final LayerNorm; then,
    unless `activate_final`, a linear output layer. `MLP`'s interface: `layer_sizes` are the
    hidden widths (all equal) followed, unless `activate_final`, by the output's; the final
    LayerNorm's output is the features an `activate_final` torso hands to its heads."""

    layer_sizes: Sequence[int]
    activate_final: bool = False
    dtype: str = "float32"
    expansion: int = 4
    output_init_std: float | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = tuple(self.layer_sizes if self.activate_final else self.layer_sizes[:-1])
        check_residual_widths(hidden)
        dense = partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32)
        norm = partial(nn.LayerNorm, dtype=self.dtype, param_dtype=jnp.float32)
        width = hidden[0]
        x = dense(width)(x)
        for _ in hidden:
            inner = nn.relu(dense(self.expansion * width)(norm()(x)))
            x = x + dense(width)(inner)
        x = norm()(x)
        if not self.activate_final:
            x = dense(self.layer_sizes[-1], **output_layer_init(self.output_init_std))(x)
        return x.astype(jnp.float32)


def hidden_layers(
    network: str,
    layer_sizes: Sequence[int],
    activate_final: bool = False,
    layer_norm: bool = False,
    dtype: str = "float32",
    output_init_std: float | None = None,
    kernel: MLPKernel = XLA_KERNELS,
) -> nn.Module:
    """The `agent.network` of these layer sizes: an `MLP`, a `ResidualMLP`, whose blocks are
    LayerNormed already, or a `SimbaV2MLP`, whose features are normalized already (`layer_norm`
    adds nothing to either). Made inside a module's call, it is
    that module's submodule (MLP_0, ResidualMLP_0, ...). `kernel`: an MLP's (`MLPKernel`)."""
    if network not in NETWORKS:
        raise ValueError(f"agent.network: must be one of {', '.join(NETWORKS)}, got {network!r}")
    if network == "residual":  # (an MLP checks its kernel itself)
        check_mlp_kernel(kernel, network=network)
        return ResidualMLP(layer_sizes, activate_final, dtype, output_init_std=output_init_std)
    if network == "simbav2":
        check_mlp_kernel(kernel, network=network)
        check_residual_widths(layer_sizes if activate_final else layer_sizes[:-1], network)
        if output_init_std is not None:
            raise ValueError(
                "agent.actor_output_init_std: not with agent.network simbav2, whose output "
                "layer's kernel columns are unit vectors (leave it null)"
            )
        return SimbaV2MLP(layer_sizes, activate_final, dtype)
    return MLP(layer_sizes, activate_final, layer_norm, dtype, output_init_std, kernel)


class NatureCNN(nn.Module):
    """The DQN torso of Mnih et al. (2015): three convolutions and a 512-unit dense layer."""

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = as_float_observation(obs)
        x = nn.relu(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
        x = nn.relu(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
        x = x.reshape((*x.shape[:-3], -1))
        return nn.relu(nn.Dense(512)(x))


class MinAtarCNN(nn.Module):
    """The MinAtar torso (Young & Tian, 2019): one 3x3 convolution of 16 filters (stride 1) and
    a 128-unit dense layer, for 10x10xC grids."""

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = nn.relu(nn.Conv(16, (3, 3), strides=(1, 1), padding="VALID")(obs.astype(jnp.float32)))
        x = x.reshape((*x.shape[:-3], -1))
        return nn.relu(nn.Dense(128)(x))


TORSOS = ("mlp", "nature_cnn", "minatar_cnn")


def default_torso(obs_shape: tuple[int, ...], obs_dtype) -> str:
    """Atari frames (uint8 images): Nature CNN; other images (MinAtar's 10x10xC): MinAtar CNN;
    vectors: MLP."""
    if len(obs_shape) != 3:
        return "mlp"
    return "nature_cnn" if jnp.dtype(obs_dtype) == jnp.uint8 else "minatar_cnn"


def observed(obs: jax.Array, bounds: tuple[int | None, int | None]) -> jax.Array:
    """The entries `bounds` (EnvSpec.actor_observes / critic_observes) of a vector observation
    a network sees, as floats."""
    return as_float_observation(obs if bounds == (None, None) else obs[..., slice(*bounds)])


class DeterministicActor(nn.Module):
    """TD3 policy: tanh output rescaled to the action bounds. `observes`: the slice of the
    observation it sees (EnvSpec.actor_observes)."""

    action_dim: int
    hidden_sizes: Sequence[int]
    action_low: float
    action_high: float
    dtype: str = "float32"
    network: str = "mlp"  # one of NETWORKS
    observes: tuple[int | None, int | None] = (None, None)
    output_init_std: float | None = None  # its output layer's (`output_layer_init`)
    kernel: MLPKernel = XLA_KERNELS

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        sizes = (*self.hidden_sizes, self.action_dim)
        layers = hidden_layers(
            self.network,
            sizes,
            dtype=self.dtype,
            output_init_std=self.output_init_std,
            kernel=self.kernel,
        )
        x = layers(observed(obs, self.observes))
        half_range = (self.action_high - self.action_low) / 2.0
        return jnp.tanh(x) * half_range + (self.action_high + self.action_low) / 2.0


class GaussianActor(nn.Module):
    """SAC policy head: mean and clamped log standard deviation of the pre-tanh Gaussian.
    `observes`: the slice of the observation it sees (EnvSpec.actor_observes)."""

    action_dim: int
    hidden_sizes: Sequence[int]
    log_std_min: float = -20.0
    log_std_max: float = 2.0
    dtype: str = "float32"
    network: str = "mlp"  # one of NETWORKS
    observes: tuple[int | None, int | None] = (None, None)
    kernel: MLPKernel = XLA_KERNELS  # its torso's (its heads are XLA's)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        layers = hidden_layers(
            self.network, self.hidden_sizes, True, dtype=self.dtype, kernel=self.kernel
        )
        x = layers(observed(obs, self.observes))
        head = lambda: nn.Dense(self.action_dim, dtype=self.dtype, param_dtype=jnp.float32)
        mean = head()(x).astype(jnp.float32)
        log_std = head()(x).astype(jnp.float32)
        return mean, jnp.clip(log_std, self.log_std_min, self.log_std_max)


class TwinCritic(nn.Module):
    """Two independent Q(s, a) networks; returns both values, shape (B, 2), or with `num_atoms`
    both critics' logits over that many returns, shape (B, 2, num_atoms) (a distributional
    critic: `agents/critics.py`). `layer_norm`: LayerNorm after each hidden layer (fastpop's
    option: FastTD3's critic has none). `network`: MLPs or residual ones (`hidden_layers`).
    `observes`: the slice of the observation they see (EnvSpec.critic_observes).
    (As one vmapped 2-member ensemble they ran no faster on an H100: results/gpu/README.md.)"""

    hidden_sizes: Sequence[int]
    dtype: str = "float32"
    layer_norm: bool = False
    num_atoms: int | None = None
    network: str = "mlp"  # one of NETWORKS
    observes: tuple[int | None, int | None] = (None, None)
    kernel: MLPKernel = XLA_KERNELS

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([observed(obs, self.observes), action], axis=-1)
        sizes = (*self.hidden_sizes, self.num_atoms or 1)
        layers = partial(
            hidden_layers,
            self.network,
            sizes,
            layer_norm=self.layer_norm,
            dtype=self.dtype,
            kernel=self.kernel,
        )
        q1 = layers()(x)
        q2 = layers()(x)
        if self.num_atoms is None:
            return jnp.concatenate([q1, q2], axis=-1)
        return jnp.stack([q1, q2], axis=-2)


class QNetwork(nn.Module):
    """DQN action values over one of `TORSOS` (the MLP flattens image observations)."""

    num_actions: int
    hidden_sizes: Sequence[int]
    torso: str
    obs_rank: int = 1  # the MLP flattens this many trailing axes
    dueling: bool = False  # Q = V + A - mean(A) (Wang et al., 2016)

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.torso == "nature_cnn":
            x = NatureCNN()(obs)
        elif self.torso == "minatar_cnn":
            x = MinAtarCNN()(obs)
        else:
            x = as_float_observation(obs)
            x = x.reshape(*x.shape[: x.ndim - self.obs_rank], -1)
            x = MLP(self.hidden_sizes, activate_final=True)(x)
        if not self.dueling:
            return nn.Dense(self.num_actions)(x)
        # The two streams are one linear layer each on the shared torso. The advantages are made
        # first, so that they are Dense_0 as the plain head is: a numpy collector reads Dense_0
        # and takes its argmax, which is Q's (Q and A differ by a per-state constant).
        advantage = nn.Dense(self.num_actions)(x)
        value = nn.Dense(1)(x)
        return value + advantage - jnp.mean(advantage, axis=-1, keepdims=True)

"""What computes an MLP's layers (`agent.mlp_kernel`, `agent.mlp_kernel_tiles`): XLA's kernels
for flax's Dense layers, or one fused Pallas kernel forward and one backward (pallas_mlp.py)
from the same parameters. The choice, its checks and the parameters are here, without Pallas:
pallas_mlp.py (and Pallas's import, ~0.1 s) is loaded only by an MLP that computes with it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

MLP_KERNELS = ("xla", "pallas")
PALLAS_TILES = (32, 64, 8)  # pallas_mlp.Tiles' defaults: rows, chunk, warps
# What a pallas MLP refuses, by the config's check and by the network's.
PALLAS_LAYERS = "fuses plain Dense + ReLU layers only (agent.network mlp, agent.layer_norm false)"


class MLPKernel(NamedTuple):
    """An MLP's kernels: one of MLP_KERNELS, and a pallas one's tiles (rows, chunk, warps;
    None: PALLAS_TILES)."""

    name: str = "xla"
    tiles: tuple[int, ...] | None = None


XLA_KERNELS = MLPKernel()


def tiles_problem(tiles) -> str | None:
    """What is wrong with an `agent.mlp_kernel_tiles` value, or None."""
    if tiles is None:
        return None
    values = list(tiles)
    powers = all(isinstance(n, int) and n >= 1 and not n & (n - 1) for n in values)
    if len(values) != 3 or not powers or min(values[:2]) < 16:
        return (
            "[rows, chunk, warps], powers of two, rows and chunk at least 16 (Triton's smallest "
            f"matmul side); null: {list(PALLAS_TILES)}; got {values}"
        )
    return None


def check_mlp_kernel(kernel: MLPKernel, layer_norm: bool = False, network: str = "mlp") -> None:
    """ValueError naming what is allowed, for an `agent.mlp_kernel` (and its tiles) a network
    cannot use (the config's check says the same before a run starts)."""
    if kernel.name not in MLP_KERNELS:
        raise ValueError(
            f"agent.mlp_kernel: must be one of {', '.join(MLP_KERNELS)}, got {kernel.name!r}"
        )
    if kernel.name == "pallas" and (layer_norm or network != "mlp"):
        raise ValueError(f"agent.mlp_kernel pallas: {PALLAS_LAYERS}")
    if (problem := tiles_problem(kernel.tiles)) is not None:
        raise ValueError(f"agent.mlp_kernel_tiles: {problem}")


class DenseParameters(nn.Module):
    """An `nn.Dense`'s kernel and bias, made as it makes them (same names, shapes and draws),
    for layers computed elsewhere."""

    inputs: int
    features: int
    kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()
    bias_init: nn.initializers.Initializer = nn.initializers.zeros

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array]:
        kernel = self.param("kernel", self.kernel_init, (self.inputs, self.features), jnp.float32)
        return kernel, self.param("bias", self.bias_init, (self.features,), jnp.float32)


def fused_layers(
    x: jax.Array,
    layer_sizes: Sequence[int],
    activate_final: bool,
    dtype: str,
    output_init: dict,
    kernel: MLPKernel,
    initializing: bool,
) -> jax.Array:
    """An MLP's Dense + ReLU layers on x in Pallas kernels, called inside a flax module's
    compact method: their parameters are its Dense_0, Dense_1, ... as `nn.Dense` would make
    them (`output_init`: the last layer's initializers). While flax initializes the module
    (`initializing`), its output is unused: jax.numpy computes it, and no kernel is compiled."""
    from fastpop.agents import pallas_mlp

    widths = (x.shape[-1], *layer_sizes)
    layers = [
        DenseParameters(
            widths[i],
            widths[i + 1],
            **(output_init if i == len(widths) - 2 else {}),
            name=f"Dense_{i}",
        )()
        for i in range(len(layer_sizes))
    ]
    kernels, biases = zip(*layers, strict=True)
    if initializing:
        return pallas_mlp.dense_layers(x, kernels, biases, activate_final)
    return pallas_mlp.fused_mlp(x, kernels, biases, activate_final, dtype, tiles=kernel.tiles)

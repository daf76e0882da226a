"""SimbaV2's hyperspherical torso (Lee et al., 2025, "Hyperspherical Normalization for Scalable
Deep Reinforcement Learning"), the network FastTD3 recommends for humanoids (its SimbaV2 variant).

Every feature vector lives on the unit sphere: the input, with a constant appended, is
l2-normalized and embedded; each block interpolates between its input and an MLP's normalized
output by a learned per-unit rate and normalizes again; learned per-unit `Scaler`s carry the
magnitudes that normalization removes. Every `HyperDense` kernel has no bias and unit-norm
columns (one per output unit): it starts so, and `project` puts it back on the sphere after each
optimizer step (`base.adam_step` calls it for every tree it steps; a tree without HyperDense
layers is left as it is, decided when the step is traced).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fastpop.types import PyTree

EPS = 1e-8  # the smallest norm divided by, and what keeps a ReLU's output off the zero vector
SHIFT = 3.0  # the constant appended to the input before its projection (SimbaV2's c_shift)
KERNEL = "hyper_dense"  # the name of every HyperDense layer's Dense, which `project` looks for


def l2normalize(x: jax.Array, axis: int = -1) -> jax.Array:
    return x / jnp.maximum(jnp.linalg.norm(x, axis=axis, keepdims=True), EPS)


def orthonormal_columns(vectors: jax.Array) -> jax.Array:
    """Gram-Schmidt of the columns of an (N, k) matrix, k <= N, each projection made twice
    (CGS2, orthogonal to float rounding): the Q of its QR with R's diagonal positive, which of a
    Gaussian matrix is a Haar-random orthonormal frame, as `nn.initializers.orthogonal` draws it.
    In jax.numpy, not LAPACK: XLA's CPU runtime deadlocked on a program holding a few dozen
    member-batched QR calls (a TD3 population's SimbaV2 init at width 32, 4 members)."""
    count = vectors.shape[1]

    def next_column(j, frame):
        done = (jnp.arange(count) < j).astype(vectors.dtype)
        v = vectors[:, j]
        for _ in range(2):
            v = v - frame @ ((frame.T @ v) * done)
        return frame.at[:, j].set(l2normalize(v))

    return jax.lax.fori_loop(0, count, next_column, jnp.zeros_like(vectors))


def unit_orthogonal(key, shape, dtype=jnp.float32) -> jax.Array:
    """An orthogonal (in, out) kernel (orthonormal columns, or rows where in < out) with each
    output unit's column scaled to unit norm (where in < out, they are shorter)."""
    rows, cols = shape
    gaussian = jax.random.normal(key, (max(rows, cols), min(rows, cols)), jnp.float32)
    frame = orthonormal_columns(gaussian)
    return l2normalize(frame if rows >= cols else frame.T, axis=0).astype(dtype)


def project(params: PyTree) -> PyTree:
    """Every HyperDense kernel in `params` with unit-norm columns again; all else unchanged."""

    def onto_sphere(path, leaf):
        names = [getattr(key, "key", None) for key in path]
        return l2normalize(leaf, axis=0) if KERNEL in names[:-1] else leaf

    return jax.tree_util.tree_map_with_path(onto_sphere, params)


class HyperDense(nn.Module):
    """A linear layer without a bias, its kernel's columns on the unit sphere."""

    features: int
    dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = nn.Dense(
            self.features,
            use_bias=False,
            kernel_init=unit_orthogonal,
            dtype=self.dtype,
            param_dtype=jnp.float32,
            name=KERNEL,
        )
        return dense(x)


class Scaler(nn.Module):
    """x times a learned per-unit scale, stored as `scale` (so that Adam's steps on it are of
    that size) and applied as `start / scale` times it: `start` at the start."""

    start: float
    scale: float

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        stored = self.param("scaler", nn.initializers.constant(self.scale), (x.shape[-1],))
        return stored * (self.start / self.scale) * x


def check_residual_widths(widths: Sequence[int], network: str = "residual") -> None:
    """A residual torso adds every block's output to its input: its widths must be equal."""
    if not widths or len(set(widths)) != 1:
        raise ValueError(
            f"agent.network {network}: agent.hidden_sizes are the widths of its residual "
            "blocks, which must all be equal (e.g. [256, 256]: two blocks of 256), got "
            f"{list(widths)}"
        )


class SimbaV2MLP(nn.Module):
    """`networks.MLP`'s interface: `layer_sizes` are the blocks' widths (all equal, one block
    each) followed, unless `activate_final`, by the output's. The input embedded onto the
    sphere, then per block x <- l2norm(x + alpha * (l2norm(MLP(x)) - x)) with the block's MLP
    HyperDense(4h) -> Scaler -> ReLU -> HyperDense(h); then, unless `activate_final` (whose
    output is the normalized features), FastTD3's head: HyperDense(h) -> Scaler ->
    HyperDense(out) plus a bias. Scales as SimbaV2 sets them for width h and B blocks: sqrt(2/h)
    for the layers' scalers, alpha starting at 1/(B+1) with steps of 1/sqrt(h)."""

    layer_sizes: Sequence[int]
    activate_final: bool = False
    dtype: str = "float32"
    expansion: int = 4

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = tuple(self.layer_sizes if self.activate_final else self.layer_sizes[:-1])
        check_residual_widths(hidden, "simbav2")  # each block adds its output to its input
        width, blocks = hidden[0], len(hidden)
        scaler = math.sqrt(2.0 / width)
        dense = lambda features: HyperDense(features, self.dtype)
        shift = jnp.full((*x.shape[:-1], 1), SHIFT, x.dtype)
        x = l2normalize(jnp.concatenate([x, shift], axis=-1))
        x = l2normalize(Scaler(scaler, scaler)(dense(width)(x)))
        inner = scaler / math.sqrt(self.expansion)
        for _ in range(blocks):
            y = Scaler(inner, inner)(dense(self.expansion * width)(x))
            y = l2normalize(dense(width)(nn.relu(y) + EPS))
            alpha = Scaler(1.0 / (blocks + 1), 1.0 / math.sqrt(width))
            x = l2normalize(x + alpha(y - x))
        if not self.activate_final:
            x = Scaler(1.0, 1.0)(dense(width)(x))
            x = dense(self.layer_sizes[-1])(x)
            x = x + self.param("bias", nn.initializers.zeros, (self.layer_sizes[-1],))
        return x.astype(jnp.float32)

"""A member's MLP in two fused Pallas kernels: its whole forward pass in one, its whole backward
pass (the input's gradient and every layer's weight and bias gradients) in another. It is what
`agent.mlp_kernel: pallas` computes with (the `pallas-mlp` lever of `fastpop bench update`).

Why: XLA runs a vmapped MLP as one batched matmul per layer plus fusions for the bias and ReLU,
and as many again for its backward: tens of kernels per update step, and on a GPU about a
quarter of the step in the gaps between them (results/gpu/README.md). Here one program holds
one tile of rows of one member (vmap over the population adds a grid axis), runs every layer on
the chip and writes only the output. The backward recomputes the forward rather than reading it
back, and writes each layer's gradients per tile of rows, which XLA then sums.

Shapes: Triton (the GPU backend) computes on power-of-two tiles of at least 16, so every width
is zero-padded to one. A padded unit has zero weights and bias: it stays 0 and adds nothing. A
padded row has a zero output gradient: it adds nothing to the weights' gradients. Weights are
read in tiles of at most `Tiles.chunk` squared, so that no one tile outgrows shared memory at any
width (a whole 256 x 256 float32 weight is 256 KiB; an H100's SM has 228).

Numbers: the same sums as XLA's, added in another order, so equal to float rounding (tested
against `networks.MLP` in tests/test_pallas_mlp.py). On the CPU the kernels run in Pallas's
interpret mode; on a GPU they lower to Triton.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton


class Tiles(NamedTuple):
    """How the kernels split the work (`agent.mlp_kernel_tiles`). Rows: of one member per
    program (the backward writes its weight gradients once per tile of rows, summed after);
    chunk: the widest tile of columns of an activation or a weight a program holds; warps:
    Triton's per program. Powers of two; rows and chunk at least 16, Triton's smallest matmul
    side (`mlp_kernels.check_mlp_kernel`)."""

    rows: int = 32
    chunk: int = 64
    warps: int = 8


class MLPShape(NamedTuple):
    """What a fused MLP's kernels are built for: static, hashable."""

    widths: tuple[int, ...]  # the input's width, then each layer's output width
    activate_final: bool  # ReLU after the last layer too
    dtype: str  # what the matmuls take their operands in; they sum in float32
    interpret: bool  # run the kernels in Pallas's interpret mode (the CPU) rather than Triton
    tiles: Tiles


def default_interpret() -> bool:
    """Interpret mode everywhere but on a GPU."""
    return jax.default_backend() != "gpu"


def padded_width(width: int) -> int:
    """The power of two, at least 16 (Triton's smallest matmul side), a width is padded to."""
    return max(16, 1 << (int(width) - 1).bit_length())


def column_tiles(width: int, chunk: int) -> list[tuple[int, int]]:
    """(start, size) of each tile of columns of a padded width."""
    size = min(width, chunk)
    return [(start, size) for start in range(0, width, size)]


def _matmul(a: jax.Array, b: jax.Array, transpose_a=False, transpose_b=False) -> jax.Array:
    """a @ b (either transposed) summed in float32, as Pallas's Triton lowering takes it."""
    contracting = ((0 if transpose_a else 1,), (1 if transpose_b else 0,))
    return jax.lax.dot_general(a, b, (contracting, ((), ())), preferred_element_type=jnp.float32)


def _layers_forward(x_tiles, weight_refs, bias_refs, padded, shape: MLPShape) -> list:
    """Every layer's activations (after its ReLU) as lists of column tiles, the input's first."""
    dtype, chunk = jnp.dtype(shape.dtype), shape.tiles.chunk
    activations = [x_tiles]
    for layer, (weight_ref, bias_ref) in enumerate(zip(weight_refs, bias_refs, strict=True)):
        relu = layer < len(weight_refs) - 1 or shape.activate_final
        outputs = []
        for start, size in column_tiles(padded[layer + 1], chunk):
            total = bias_ref[:, pl.ds(start, size)].astype(jnp.float32)
            for (row, rows), tile in zip(
                column_tiles(padded[layer], chunk), activations[-1], strict=True
            ):
                weights = weight_ref[pl.ds(row, rows), pl.ds(start, size)].astype(dtype)
                total = total + _matmul(tile.astype(dtype), weights)
            outputs.append(jnp.maximum(total, 0.0) if relu else total)
        activations.append(outputs)
    return activations


def _forward_kernel(shape: MLPShape, padded: tuple[int, ...]):
    layers, chunk = len(padded) - 1, shape.tiles.chunk

    def kernel(x_ref, *refs):
        weight_refs, bias_refs, out_ref = refs[:layers], refs[layers:-1], refs[-1]
        x_tiles = [x_ref[:, pl.ds(start, size)] for start, size in column_tiles(padded[0], chunk)]
        outputs = _layers_forward(x_tiles, weight_refs, bias_refs, padded, shape)[-1]
        for (start, size), tile in zip(column_tiles(padded[-1], chunk), outputs, strict=True):
            out_ref[:, pl.ds(start, size)] = tile

    return kernel


def _relu_gradient(grads: list, activations: list) -> list:
    """Gradient tiles through a ReLU, from its output tiles (0 where the unit was off)."""
    return [jnp.where(a > 0, g, 0.0) for g, a in zip(grads, activations, strict=True)]


def _store_parameter_gradients(weight_grad_ref, bias_grad_ref, inputs, grads, tiles, dtype):
    """One layer's weight gradient (its inputs' tiles, transposed, times the gradient tiles)
    and bias gradient (the gradient summed over rows), tile by tile, for this tile of rows."""
    tiles_in, tiles_out = tiles
    for (row, row_size), tile in zip(tiles_in, inputs, strict=True):
        for (col, col_size), grad in zip(tiles_out, grads, strict=True):
            product = _matmul(tile.astype(dtype), grad.astype(dtype), transpose_a=True)
            weight_grad_ref[pl.ds(row, row_size), pl.ds(col, col_size)] = product
    for (col, col_size), grad in zip(tiles_out, grads, strict=True):
        bias_grad_ref[:, pl.ds(col, col_size)] = jnp.sum(grad, 0, keepdims=True)


def _input_gradient(weight_ref, grads, tiles, dtype) -> list:
    """The gradient of one layer's input, as tiles: the gradient tiles times the weights'
    tiles, transposed."""
    tiles_in, tiles_out = tiles
    back = []
    for row, row_size in tiles_in:
        terms = []
        for (col, col_size), grad in zip(tiles_out, grads, strict=True):
            weights = weight_ref[pl.ds(row, row_size), pl.ds(col, col_size)].astype(dtype)
            terms.append(_matmul(grad.astype(dtype), weights, transpose_b=True))
        back.append(sum(terms[1:], terms[0]))
    return back


def _backward_kernel(shape: MLPShape, padded: tuple[int, ...]):
    layers, chunk, dtype = len(padded) - 1, shape.tiles.chunk, jnp.dtype(shape.dtype)
    tiles = [column_tiles(width, chunk) for width in padded]

    def kernel(x_ref, *refs):
        weight_refs, bias_refs = refs[:layers], refs[layers : 2 * layers]
        out_grad_ref, x_grad_ref = refs[2 * layers], refs[2 * layers + 1]
        weight_grad_refs, bias_grad_refs = refs[2 * layers + 2 : 3 * layers + 2], refs[-layers:]
        x_tiles = [x_ref[:, pl.ds(start, size)] for start, size in tiles[0]]
        activations = _layers_forward(x_tiles, weight_refs, bias_refs, padded, shape)
        grads = [out_grad_ref[:, pl.ds(start, size)] for start, size in tiles[-1]]
        if shape.activate_final:
            grads = _relu_gradient(grads, activations[-1])
        for layer in reversed(range(layers)):
            pair = (tiles[layer], tiles[layer + 1])
            _store_parameter_gradients(
                weight_grad_refs[layer],
                bias_grad_refs[layer],
                activations[layer],
                grads,
                pair,
                dtype,
            )
            back = _input_gradient(weight_refs[layer], grads, pair, dtype)
            grads = back if layer == 0 else _relu_gradient(back, activations[layer])
        for (start, size), grad in zip(tiles[0], grads, strict=True):
            x_grad_ref[:, pl.ds(start, size)] = grad

    return kernel


class _Padded(NamedTuple):
    widths: tuple[int, ...]
    block_rows: int
    x: jax.Array
    kernels: list
    biases: list


def _pad(array: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    return jnp.pad(
        array, [(0, target - size) for size, target in zip(array.shape, shape, strict=True)]
    )


def _padded(shape: MLPShape, x: jax.Array, kernels, biases) -> _Padded:
    widths = tuple(padded_width(width) for width in shape.widths)
    block_rows = min(shape.tiles.rows, padded_width(x.shape[0]))
    rows = -(-x.shape[0] // block_rows) * block_rows
    x = _pad(x.astype(jnp.float32), (rows, widths[0]))
    kernels = [_pad(k, (widths[i], widths[i + 1])) for i, k in enumerate(kernels)]
    biases = [_pad(b.reshape(1, -1), (1, widths[i + 1])) for i, b in enumerate(biases)]
    return _Padded(widths, block_rows, x, kernels, biases)


def _call(kernel, shape: MLPShape, padded: _Padded, operands, out_specs, out_shape):
    """`kernel` over the row tiles of `padded.x`: the rows' operands tiled, the weights whole."""
    whole = [pl.BlockSpec(k.shape, lambda i: (0, 0)) for k in (*padded.kernels, *padded.biases)]
    row_tiles = pl.BlockSpec((padded.block_rows, padded.widths[0]), lambda i: (i, 0))
    in_specs = [row_tiles, *whole]
    if len(operands) > len(in_specs):  # the output's gradient, tiled as the output
        in_specs.append(pl.BlockSpec((padded.block_rows, padded.widths[-1]), lambda i: (i, 0)))
    return pl.pallas_call(
        kernel,
        out_shape=out_shape,
        grid=(padded.x.shape[0] // padded.block_rows,),
        in_specs=in_specs,
        out_specs=out_specs,
        interpret=shape.interpret,
        compiler_params=pallas_triton.CompilerParams(num_warps=shape.tiles.warps, num_stages=1),
    )(*operands)


def _forward(shape: MLPShape, x: jax.Array, kernels, biases) -> jax.Array:
    padded = _padded(shape, x, kernels, biases)
    rows, width = padded.x.shape[0], padded.widths[-1]
    out = _call(
        _forward_kernel(shape, padded.widths),
        shape,
        padded,
        (padded.x, *padded.kernels, *padded.biases),
        pl.BlockSpec((padded.block_rows, width), lambda i: (i, 0)),
        jax.ShapeDtypeStruct((rows, width), jnp.float32),
    )
    return out[: x.shape[0], : shape.widths[-1]]


def _backward(shape: MLPShape, residuals, out_grad: jax.Array):
    x, kernels, biases = residuals
    padded = _padded(shape, x, kernels, biases)
    widths, tiles = padded.widths, padded.x.shape[0] // padded.block_rows
    out_grad = _pad(out_grad.astype(jnp.float32), (padded.x.shape[0], widths[-1]))
    pairs = list(itertools.pairwise(widths))
    out_specs = [
        pl.BlockSpec((padded.block_rows, widths[0]), lambda i: (i, 0)),
        *[pl.BlockSpec((pl.squeezed, r, c), lambda i: (i, 0, 0)) for r, c in pairs],
        *[pl.BlockSpec((pl.squeezed, 1, c), lambda i: (i, 0, 0)) for _, c in pairs],
    ]
    out_shape = [
        jax.ShapeDtypeStruct(padded.x.shape, jnp.float32),
        *[jax.ShapeDtypeStruct((tiles, r, c), jnp.float32) for r, c in pairs],
        *[jax.ShapeDtypeStruct((tiles, 1, c), jnp.float32) for _, c in pairs],
    ]
    operands = (padded.x, *padded.kernels, *padded.biases, out_grad)
    x_grad, *per_tile = _call(
        _backward_kernel(shape, padded.widths), shape, padded, operands, out_specs, out_shape
    )
    layers = len(kernels)
    kernel_grads = tuple(
        g.sum(0)[: k.shape[0], : k.shape[1]]
        for g, k in zip(per_tile[:layers], kernels, strict=True)
    )
    bias_grads = tuple(
        g.sum((0, 1))[: b.shape[0]] for g, b in zip(per_tile[layers:], biases, strict=True)
    )
    return x_grad[: x.shape[0], : x.shape[1]].astype(x.dtype), kernel_grads, bias_grads


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _fused(shape: MLPShape, x: jax.Array, kernels: tuple, biases: tuple) -> jax.Array:
    return _forward(shape, x, kernels, biases)


def _fused_forward(shape, x, kernels, biases):
    return _forward(shape, x, kernels, biases), (x, kernels, biases)


_fused.defvjp(_fused_forward, _backward)


def dense_layers(x: jax.Array, kernels, biases, activate_final: bool = False) -> jax.Array:
    """The same layers in plain jax.numpy (what flax's init computes, its output unused, and
    the tests' reference)."""
    for layer, (kernel, bias) in enumerate(zip(kernels, biases, strict=True)):
        x = x @ kernel + bias
        if layer < len(kernels) - 1 or activate_final:
            x = jax.nn.relu(x)
    return x


def fused_mlp(
    x: jax.Array,
    kernels,
    biases,
    activate_final: bool = False,
    dtype: str = "float32",
    interpret: bool | None = None,
    tiles: Sequence[int] | None = None,
) -> jax.Array:
    """Dense ReLU layers (`kernels[i]`: (in, out), `biases[i]`: (out,)) on x (..., in), as
    `networks.MLP` computes them, in one Pallas kernel forward and one backward; float32 out.
    `interpret`: None, `default_interpret()`; `tiles`: (rows, chunk, warps), None: `Tiles()`."""
    kernels, biases = tuple(kernels), tuple(biases)
    widths = (x.shape[-1], *(k.shape[1] for k in kernels))
    interpret = default_interpret() if interpret is None else interpret
    tiles = Tiles() if tiles is None else Tiles(*map(int, tiles))
    shape = MLPShape(widths, bool(activate_final), str(dtype), bool(interpret), tiles)
    rows = x.reshape(-1, x.shape[-1])
    return _fused(shape, rows, kernels, biases).reshape(*x.shape[:-1], widths[-1])

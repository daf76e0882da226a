"""The fused Pallas MLP (agents/pallas_mlp.py, `agent.mlp_kernel: pallas`): its two kernels
compute a Dense + ReLU stack and its gradients as XLA does, to float rounding, from flax's own
parameters; on a GPU they lower to Triton kernels. On the CPU they run in interpret mode."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.agents import make_agent, mlp_kernels, networks, pallas_mlp
from tests.helpers import TINY_SPECS, refused_train
from tests.runs import TD3_PENDULUM


def stacked_layers(widths, members, key):
    keys = jax.random.split(key, 2 * len(widths))
    kernels = [
        jax.random.normal(keys[i], (members, n, m)) / np.sqrt(n)
        for i, (n, m) in enumerate(itertools.pairwise(widths))
    ]
    biases = [0.3 * jax.random.normal(keys[-1 - i], (members, m)) for i, m in enumerate(widths[1:])]
    return kernels, biases


def allclose(a, b) -> bool:
    return all(
        np.allclose(x, y, rtol=1e-4, atol=1e-5)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


@pytest.mark.parametrize("activate_final", [False, True])
def test_the_fused_kernels_compute_a_members_mlp_and_every_gradient(activate_final):
    # Widths padded to 16, 128 (two tiles of 64), 128 and 16; 37 rows: two tiles of 32, the
    # second mostly padding; two members through vmap (a grid axis of the kernels).
    widths, members = (13, 100, 70, 3), 2
    kernels, biases = stacked_layers(widths, members, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (members, 37, widths[0]))

    def loss(mlp):
        # a cotangent unlike ones everywhere, so that every row and column is weighed apart
        return lambda x, k, b: jnp.sum(jnp.sin(mlp(x, k, b, activate_final)))

    fused = jax.jit(jax.vmap(jax.value_and_grad(loss(pallas_mlp.fused_mlp), (0, 1, 2))))
    expected = jax.vmap(jax.value_and_grad(loss(pallas_mlp.dense_layers), (0, 1, 2)))
    got, want = fused(x, kernels, biases), expected(x, kernels, biases)
    assert allclose(got, want)
    # the gradients reach every layer: none is zero
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(got[1]))
    # the forward alone (no gradient asked): its kernel without the backward's
    forward = jax.vmap(pallas_mlp.fused_mlp, (0, 0, 0, None))(x, kernels, biases, activate_final)
    assert forward.shape == (members, 37, widths[-1])
    assert allclose(
        forward,
        jax.vmap(pallas_mlp.dense_layers, (0, 0, 0, None))(x, kernels, biases, activate_final),
    )


def test_an_mlp_on_pallas_kernels_has_flaxs_parameters_and_outputs():
    x = jax.random.normal(jax.random.key(2), (5, 7))
    for options in ({}, {"output_init_std": 0.01}, {"activate_final": True}):
        xla = networks.MLP((24, 9), **options)
        fused = networks.MLP((24, 9), kernel=mlp_kernels.MLPKernel("pallas"), **options)
        params = xla.init(jax.random.key(3), x)
        assert jax.tree.map(np.shape, fused.init(jax.random.key(3), x)) == jax.tree.map(
            np.shape, params
        )
        assert allclose(fused.init(jax.random.key(3), x), params)
        assert allclose(fused.apply(params, x), xla.apply(params, x))
    # bfloat16 operands, float32 sums: within bfloat16's rounding of float32's
    xla, fused = (
        networks.MLP((24, 9)),
        networks.MLP((24, 9), dtype="bfloat16", kernel=mlp_kernels.MLPKernel("pallas")),
    )
    params = xla.init(jax.random.key(3), x)
    got, want = fused.apply(params, x), xla.apply(params, x)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mlp_kernel": "cuda"}, "agent.mlp_kernel: must be one of xla, pallas, got 'cuda'"),
        ({"mlp_kernel": "pallas", "layer_norm": True}, "agent.layer_norm false"),
        ({"mlp_kernel": "pallas", "network": "residual"}, "agent.network mlp"),
        ({"mlp_kernel": "pallas", "mlp_kernel_tiles": (32, 64, 3)}, "agent.mlp_kernel_tiles"),
    ],
)
def test_a_kernel_the_networks_cannot_use_is_refused_by_name(fields, message):
    agent = make_agent("td3", TINY_SPECS["td3"], hidden_sizes=(16, 16), batch_size=8, **fields)
    with pytest.raises(ValueError, match=message):
        agent.init(jax.random.key(0), agent.default_hparams())


def test_another_tiling_computes_the_same_and_a_wrong_one_is_refused_by_name():
    # 16 rows and 32 columns per program: three tiles of rows, four of the hidden layer's columns
    widths = (13, 100, 3)
    kernels, biases = stacked_layers(widths, 1, jax.random.key(4))
    kernels, biases = [k[0] for k in kernels], [b[0] for b in biases]
    x = jax.random.normal(jax.random.key(5), (37, widths[0]))

    def loss(mlp, **options):
        return lambda x, k, b: jnp.sum(jnp.sin(mlp(x, k, b, **options)))

    fused = jax.value_and_grad(loss(pallas_mlp.fused_mlp, tiles=(16, 32, 4)), (0, 1, 2))
    expected = jax.value_and_grad(loss(pallas_mlp.dense_layers), (0, 1, 2))
    assert allclose(jax.jit(fused)(x, kernels, biases), expected(x, kernels, biases))
    # the default the config names (mlp_kernels, which does not import Pallas) is the kernels'
    assert tuple(pallas_mlp.Tiles()) == mlp_kernels.PALLAS_TILES
    assert mlp_kernels.tiles_problem(mlp_kernels.PALLAS_TILES) is None
    for wrong in ((48, 64, 8), (8, 64, 8), (32, 64), (32, 64, 3)):
        with pytest.raises(ValueError, match=r"agent.mlp_kernel_tiles: \[rows, chunk, warps\]"):
            mlp_kernels.check_mlp_kernel(mlp_kernels.MLPKernel("pallas", wrong))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["agent.mlp_kernel=pallas", "agent.layer_norm=true"],
            "agent.mlp_kernel: fuses plain Dense + ReLU layers only (agent.network mlp, "
            "agent.layer_norm false), got agent.network mlp and agent.layer_norm true",
        ),
        (["agent.mlp_kernel_tiles=[32,64,6]"], "agent.mlp_kernel_tiles: [rows, chunk, warps]"),
    ],
)
def test_train_refuses_a_pallas_mlp_it_cannot_build_before_it_starts(
    tmp_path, capsys, overrides, message
):
    err = refused_train(tmp_path, capsys, TD3_PENDULUM, *overrides)
    assert message in err

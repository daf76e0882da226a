"""`agent.network: simbav2` (agents/hyperspherical.py): SimbaV2's torso as its paper and FastTD3's
SimbaV2 variant compute it, written out in numpy; its kernels kept on the unit sphere by every
optimizer step, member by member; and the config's refusals."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.agents import hyperspherical
from fastpop.agents.hyperspherical import SHIFT, SimbaV2MLP
from fastpop.config import ConfigError, load_config
from fastpop.types import Transition
from tests.helpers import TINY_SPECS, tiny_agent


def unit(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), 1e-8)


def column_errors(tree) -> list[float]:
    """Per HyperDense kernel: how far its columns' norms are from 1."""
    return [
        float(np.abs(np.linalg.norm(np.asarray(leaf), axis=-2) - 1.0).max())
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if hyperspherical.KERNEL in jax.tree_util.keystr(path)
    ]


def test_the_torso_is_simbav2s_written_out_in_numpy():
    """Width 8, two blocks, 3 outputs: embedder, LERP blocks and FastTD3's head, each scaler as
    stored * start / scale; every layer trained (each gets a gradient)."""
    module = SimbaV2MLP((8, 8, 3))
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)

    @jax.jit
    def forward(x):
        params = module.init(jax.random.key(1), x)
        grads = jax.grad(lambda p: jnp.sum(jnp.square(module.apply(p, x))))(params)
        return params["params"], module.apply(params, x), grads["params"]

    params, output, grads = jax.tree.map(np.asarray, forward(x))
    kernel = lambda i: params[f"HyperDense_{i}"]["hyper_dense"]["kernel"]
    shapes = [kernel(i).shape for i in range(7)]
    assert shapes == [(6, 8), (8, 32), (32, 8), (8, 32), (32, 8), (8, 8), (8, 3)]
    assert max(column_errors(params)) < 1e-6  # on the sphere from the start, (6, 8) included
    np.testing.assert_allclose(kernel(2).T @ kernel(2), np.eye(8), atol=1e-5)  # orthogonal

    scaler = math.sqrt(2 / 8)
    starts = [scaler, scaler / 2, 1 / 3, scaler / 2, 1 / 3, 1.0]  # alpha: 1/(B+1), B = 2
    scales = [scaler, scaler / 2, 1 / math.sqrt(8), scaler / 2, 1 / math.sqrt(8), 1.0]
    scale = lambda i, h: params[f"Scaler_{i}"]["scaler"] * (starts[i] / scales[i]) * h
    h = unit(np.concatenate([x, np.full((4, 1), SHIFT, np.float32)], axis=-1))
    h = unit(scale(0, h @ kernel(0)))
    for block in (0, 1):
        inner = scale(1 + 2 * block, h @ kernel(1 + 2 * block))
        y = unit((np.maximum(inner, 0.0) + 1e-8) @ kernel(2 + 2 * block))
        h = unit(h + scale(2 + 2 * block, y - h))
    expected = scale(5, h @ kernel(5)) @ kernel(6) + params["bias"]
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)
    assert all(np.any(leaf != 0.0) for leaf in jax.tree.leaves(grads))
    with pytest.raises(ValueError, match="must all be equal"):
        init_shapes(tiny_agent("td3", network="simbav2", hidden_sizes=(8, 4)))
    with pytest.raises(ValueError, match=r"agent\.network simbav2: .* got \[8, 4\]"):
        SimbaV2MLP((8, 4, 3)).init(jax.random.key(0), x)  # the module alone checks them too


def test_the_orthogonal_frames_are_orthonormal_and_need_no_lapack():
    """A square Gaussian's Gram-Schmidt frame (the hardest case: its last columns are nearly
    dependent) is orthonormal; its program calls no LAPACK routine."""
    gaussian = jax.random.normal(jax.random.key(2), (64, 64))
    frame = np.asarray(jax.jit(hyperspherical.orthonormal_columns)(gaussian))
    np.testing.assert_allclose(frame.T @ frame, np.eye(64), atol=2e-5)
    text = jax.jit(hyperspherical.orthonormal_columns).lower(gaussian).as_text()
    assert "lapack" not in text.lower() and "custom_call" not in text


def init_shapes(agent):
    return jax.eval_shape(agent.init, jax.random.key(0), agent.default_hparams())


def random_batch(spec, size: int, seed: int) -> Transition:
    rng = np.random.default_rng(seed)
    obs = lambda: rng.standard_normal((size, *spec.obs_shape)).astype(np.float32)
    action = rng.uniform(-1, 1, (size, spec.action_dim)).astype(np.float32)
    flags = np.zeros(size, np.float32)
    return Transition(
        obs(), action, rng.standard_normal(size).astype(np.float32), obs(), flags, flags
    )


def test_every_step_keeps_the_kernels_on_the_sphere_member_by_member():
    """Four TD3 members' updates vmapped equal each member's own (the projection is per member),
    the kernels move and stay unit columns; SAC's actor and critics are SimbaV2's too; a tree
    without HyperDense layers is left as it is."""
    agent = tiny_agent("td3", network="simbav2", hidden_sizes=(8, 8))
    hparams = agent.default_hparams()._replace(policy_delay=np.int32(1))  # every layer steps
    batch = random_batch(TINY_SPECS["td3"], agent.batch_size, 3)
    keys = jax.random.split(jax.random.key(5), 4)

    def update(key):
        state = agent.init(key, hparams)
        return state, agent.update(state, batch, hparams, key)[0]

    before, stacked = jax.jit(jax.vmap(update))(keys)
    single = jax.jit(update)
    for member in range(4):
        alone = single(keys[member])[1]
        for got, want in zip(jax.tree.leaves(stacked), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(got[member], want, rtol=2e-5, atol=2e-6)
    for network in ("actor", "critic"):
        moved, start = getattr(stacked, network), getattr(before, network)
        assert max(column_errors(moved)) < 1e-5
        assert not any(map(np.array_equal, jax.tree.leaves(moved), jax.tree.leaves(start)))
    sac = init_shapes(tiny_agent("sac", network="simbav2", hidden_sizes=(8, 8)))
    assert "SimbaV2MLP_0" in sac.actor["params"]
    assert set(sac.critic["params"]) == {"SimbaV2MLP_0", "SimbaV2MLP_1"}
    plain = init_shapes(tiny_agent("td3")).critic
    projected = jax.tree.leaves(hyperspherical.project(plain))
    assert all(a is b for a, b in zip(projected, jax.tree.leaves(plain), strict=True))


def test_the_config_takes_simbav2_and_refuses_what_it_cannot_be():
    config = load_config(None, ["agent.network=simbav2", "agent.hidden_sizes=[64, 64]"])
    assert config.agent["network"] == "simbav2"
    refusals = {
        "agent.network=simba": "agent.network: must be one of mlp, residual, simbav2",
        "agent.network=simbav2": "agent.hidden_sizes: must be equal widths with agent.network: "
        "simbav2",
    }
    for override, message in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [override, "agent.hidden_sizes=[64, 32]"])
    with pytest.raises(ValueError, match=r"actor_output_init_std: not with agent\.network simbav2"):
        init_shapes(tiny_agent("td3", network="simbav2", actor_output_init_std=0.01))

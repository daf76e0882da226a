"""DvD's behavioural diversity (Parker-Holder et al., NeurIPS 2020), made numerically safe.

A member's behavioural embedding is its actions on one shared batch of states; the population's
diversity is log det K, K the RBF kernel between embeddings. Where the paper's code could produce
NaNs this does not: squared distances are summed squares of differences (never negative, unlike
|a|^2 + |b|^2 - 2ab), K gets `jitter` on its diagonal, and the log-determinant comes from a
Cholesky factor, finite even when two members coincide (K singular before the jitter).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def embeddings(actor_apply, actors, obs: jax.Array) -> jax.Array:
    """(P, N * action_dim): each member's deterministic actions on the shared states."""
    return jax.vmap(lambda actor: actor_apply(actor, obs).reshape(-1))(actors)


def squared_distances(embeddings: jax.Array) -> jax.Array:
    """(P, P) mean squared difference per embedding coordinate (>= 0 exactly, 0 on the diagonal)."""
    differences = embeddings[:, None, :] - embeddings[None, :, :]
    return jnp.mean(jnp.square(differences), axis=-1)


def rbf_kernel(embeddings: jax.Array, length_scale: float = 1.0) -> jax.Array:
    return jnp.exp(-squared_distances(embeddings) / (2.0 * length_scale**2))


def log_det(kernel: jax.Array, jitter: float = 1e-3) -> jax.Array:
    """log det (K + jitter I) through its Cholesky factor."""
    size = kernel.shape[0]
    factor = jnp.linalg.cholesky(kernel + jitter * jnp.eye(size, dtype=kernel.dtype))
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(factor)))


def diversity_metrics(
    actor_apply, actors, obs: jax.Array, length_scale: float = 1.0, jitter: float = 1e-3
) -> dict[str, jax.Array]:
    """What is logged per evaluation: log det K and the mean pairwise distance."""
    points = embeddings(actor_apply, actors, obs)
    distances = jnp.sqrt(squared_distances(points))
    size = points.shape[0]
    pairs = size * (size - 1)
    return {
        "log_det_kernel": log_det(rbf_kernel(points, length_scale), jitter),
        "mean_pairwise_distance": jnp.sum(distances) / max(pairs, 1),
    }

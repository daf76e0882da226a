"""Diagonal-Gaussian cross-entropy method (the sepCEM of CEM-RL, Pourchot & Sigaud, ICLR 2019).

Pure functions over a `CEMState` of flat parameter vectors:

    ask(state, key, size) -> (size, D) mirrored samples: mean + eps and mean - eps
    tell(state, samples, fitness, ...) -> state: the mean moves to the log-rank weighted elites,
        the variance is the elites' weighted spread around the OLD mean plus an additive noise
        that decays towards a floor (so the search never collapses to a point).

The refit is the paper's (arXiv:1810.01222, its CEM update), with K_e elites z_i, best first:

    lambda_i = log((K_e + 1) / i) / sum_j log((K_e + 1) / j)
    mean'     = sum_i lambda_i z_i
    variance' = sum_i lambda_i (z_i - mean)^2 + noise     (the noise in force)
    noise'    = noise_decay * noise + (1 - noise_decay) * noise_floor

The authors' code differs in two places (apourchot/CEM-RL, ES.py, `sepCEM.tell`, lines 512-518
at commit 1a45822): it decays the noise first (line 513) and adds the decayed value, and it
divides the weighted spread by K_e (`1 / self.parents * self.weights @ (z * z)`, line 517), so
its spread term is K_e times smaller than the formula's. fastpop follows the formula (test:
tests/test_cem.py, against a float64 numpy transcription of it).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class CEMState(NamedTuple):
    mean: jax.Array  # (D,)
    variance: jax.Array  # (D,)
    noise: jax.Array  # scalar: the additive variance of the next tell


def init(mean: jax.Array, initial_variance: float, initial_noise: float) -> CEMState:
    mean = jnp.asarray(mean, jnp.float32)
    return CEMState(
        mean=mean,
        variance=jnp.full_like(mean, initial_variance),
        noise=jnp.asarray(initial_noise, jnp.float32),
    )


def ask(state: CEMState, key: jax.Array, size: int) -> jax.Array:
    """`size` (even) samples in mirrored pairs: row i and row i + size/2 are mean +- eps_i."""
    if size % 2:
        raise ValueError(f"mirrored sampling needs an even number of samples, got {size}")
    half = jax.random.normal(key, (size // 2, state.mean.shape[0])) * jnp.sqrt(state.variance)
    return state.mean + jnp.concatenate([half, -half])


def elite_weights(num_elites: int) -> jax.Array:
    """log-rank weights, best first: log((n + 1) / i), normalised to sum to 1."""
    ranks = jnp.arange(1, num_elites + 1, dtype=jnp.float32)
    weights = jnp.log((num_elites + 1) / ranks)
    return weights / jnp.sum(weights)


def num_elites(size: int, elite_fraction: float) -> int:
    return max(1, round(size * elite_fraction))


def tell(
    state: CEMState,
    samples: jax.Array,
    fitness: jax.Array,
    elite_fraction: float = 0.5,
    noise_decay: float = 0.95,
    noise_floor: float = 1e-5,
) -> CEMState:
    """Refit to the elites (higher fitness is better; NaN ranks last)."""
    count = num_elites(samples.shape[0], elite_fraction)
    order = jnp.argsort(jnp.where(jnp.isnan(fitness), -jnp.inf, fitness), descending=True)
    elites = samples[order[:count]]
    weights = elite_weights(count)
    deviation = elites - state.mean
    return CEMState(
        mean=weights @ elites,
        variance=weights @ jnp.square(deviation) + state.noise,
        noise=noise_decay * state.noise + (1 - noise_decay) * noise_floor,
    )

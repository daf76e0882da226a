"""sepCEM's refit against a float64 numpy transcription of the paper's update."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.strategies import cem


def paper_tell(mean, noise, samples, fitness, elite_fraction, noise_decay, noise_floor):
    """Pourchot & Sigaud (2019)'s CEM update in float64: the K_e best samples z_i (best first),
    lambda_i = log((K_e + 1) / i) normalised, mu' = sum lambda_i z_i,
    Sigma' = sum lambda_i (z_i - mu)^2 + eps (the eps in force), eps' = tau eps + (1 - tau) eps_end.
    """
    count = max(1, round(len(samples) * elite_fraction))
    elites = samples[np.argsort(-fitness, kind="stable")[:count]]
    weights = np.log((count + 1) / np.arange(1, count + 1))
    weights /= weights.sum()
    new_mean = weights @ elites
    variance = weights @ (elites - mean) ** 2 + noise
    return new_mean, variance, noise_decay * noise + (1 - noise_decay) * noise_floor


@pytest.mark.parametrize("size,elite_fraction", [(10, 0.5), (16, 0.25), (4, 1.0)])
def test_tell_matches_the_papers_update_in_float64(size, elite_fraction):
    rng = np.random.default_rng(size)
    dim = 37
    mean = rng.normal(size=dim)
    samples = mean + 0.1 * rng.normal(size=(size, dim))
    fitness = rng.normal(size=size) * 100
    state = cem.CEMState(
        jnp.asarray(mean, jnp.float32),
        jnp.full(dim, 0.01, jnp.float32),
        jnp.asarray(2e-3, jnp.float32),
    )
    new = cem.tell(
        state,
        jnp.asarray(samples, jnp.float32),
        jnp.asarray(fitness, jnp.float32),
        elite_fraction,
        noise_decay=0.95,
        noise_floor=1e-5,
    )
    want_mean, want_variance, want_noise = paper_tell(
        np.asarray(state.mean, np.float64),  # the float32 values tell starts from
        2e-3,
        np.asarray(jnp.asarray(samples, jnp.float32), np.float64),
        fitness,
        elite_fraction,
        0.95,
        1e-5,
    )
    np.testing.assert_allclose(np.asarray(new.mean, np.float64), want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new.variance, np.float64), want_variance, rtol=1e-4)
    assert float(new.noise) == pytest.approx(want_noise, rel=1e-6)

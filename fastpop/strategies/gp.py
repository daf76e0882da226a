"""A small Gaussian process over (hparams in the unit box, time) for PB2's explore step.

The kernel is PB2's time-varying squared exponential (Parker-Holder et al., 2020):

    k((x, t), (x', t')) = exp(-|x - x'|^2 / (2 l^2)) * (1 - eps) ** (|t - t'| / 2)

so observations from long ago count less; eps = 0 is an ordinary SE kernel. Targets are
standardized, so the signal variance is 1, and clipped to [-2, 2] as Ray Tune's PB2 clips them
(`standardized`): unclipped, one heavy-tailed change (a member's return jumping by several
standard deviations while the others move little) held the fit's mean up around itself and the
choices went there, not to where the rest of the changes were best. The scale stays the standard
deviation of every change: a scale the tail does not widen (median and interquartile range, or
one re-estimated from the clipped changes) also bounded a change of a hundred standard deviations,
but clipped the informative tail of bad regions with it, and PB2 then found a quadratic bowl's
optimum far less well (tests/test_pb2.py). The length scale l, eps and the noise variance are
chosen by the log marginal likelihood over a fixed grid: deterministic, no optimizer restarts,
and exact at PB2's sizes (a population times a few dozen evaluations: a few hundred points).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy as np
import scipy.linalg

LENGTH_SCALES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
EPSILONS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.4)
NOISES = (0.01, 0.1, 0.4)  # in units of the standardized targets' variance
TARGET_CLIP = 2.0  # standardized targets beyond +-2 count as +-2 (Ray Tune's pb2_utils)


class Fit(NamedTuple):
    x: np.ndarray  # (n, d) inputs in the unit box
    t: np.ndarray  # (n,) time of each input (evaluation index)
    y_center: float  # the targets' mean (`standardized`)
    y_scale: float  # their standard deviation
    length_scale: float
    epsilon: float
    noise: float
    cholesky: np.ndarray  # of K + noise * I
    alpha: np.ndarray  # (K + noise * I)^-1 y, y standardized


def kernel(
    x: np.ndarray,
    t: np.ndarray,
    x2: np.ndarray,
    t2: np.ndarray,
    length_scale: float,
    epsilon: float,
) -> np.ndarray:
    return _se(_squared_distances(x, x2), length_scale) * _decay(_time_gaps(t, t2), epsilon)


def _squared_distances(x: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """Summed one dimension at a time: no (n, m, d) temporary."""
    squared = np.zeros((len(x), len(x2)))
    for dim in range(x.shape[1]):
        squared += (x[:, dim, None] - x2[None, :, dim]) ** 2
    return squared


def _time_gaps(t: np.ndarray, t2: np.ndarray) -> np.ndarray:
    return np.abs(t[:, None] - t2[None, :])


def _se(squared: np.ndarray, length_scale: float) -> np.ndarray:
    return np.exp(-squared / (2.0 * length_scale**2))


def _decay(gaps: np.ndarray, epsilon: float) -> np.ndarray:
    return (1.0 - epsilon) ** (gaps / 2.0)


def _factor(covariance: np.ndarray, targets: np.ndarray):
    """(cholesky, alpha, log marginal likelihood) of one covariance (kernel + noise)."""
    cholesky = scipy.linalg.cholesky(covariance, lower=True, check_finite=False)
    alpha = scipy.linalg.cho_solve((cholesky, True), targets, check_finite=False)
    log_likelihood = (
        -0.5 * targets @ alpha
        - np.sum(np.log(np.diag(cholesky)))
        - 0.5 * len(covariance) * np.log(2 * np.pi)
    )
    return cholesky, alpha, log_likelihood


def standardized(y: np.ndarray) -> tuple[float, float, np.ndarray]:
    """(mean, standard deviation, (y - mean) / deviation clipped to +-TARGET_CLIP); a
    deviation of 1 where every target is the same."""
    center, scale = float(y.mean()), float(y.std())
    scale = scale if scale > 1e-12 else 1.0
    return center, scale, np.clip((y - center) / scale, -TARGET_CLIP, TARGET_CLIP)


def fit(x: np.ndarray, t: np.ndarray, y: np.ndarray) -> Fit:
    """The grid setting of highest marginal likelihood for (x, t) -> y; needs >= 1 point.
    Distances, time gaps and each length scale's and epsilon's factor are computed once: the
    grid's 108 settings then cost a product and a Cholesky factorization each."""
    x, t, y = np.asarray(x, np.float64), np.asarray(t, np.float64), np.asarray(y, np.float64)
    y_center, y_scale, targets = standardized(y)
    squared, gaps, diagonal = _squared_distances(x, x), _time_gaps(t, t), np.diag_indices(len(x))
    decays = {epsilon: _decay(gaps, epsilon) for epsilon in EPSILONS}
    best = None
    for length_scale in LENGTH_SCALES:
        se = _se(squared, length_scale)
        for epsilon, noise in itertools.product(EPSILONS, NOISES):
            covariance = se * decays[epsilon]
            covariance[diagonal] += noise
            cholesky, alpha, log_likelihood = _factor(covariance, targets)
            if best is None or log_likelihood > best[0]:
                best = (
                    log_likelihood,
                    Fit(x, t, y_center, y_scale, length_scale, epsilon, noise, cholesky, alpha),
                )
    return best[1]


def with_pending(model: Fit, x: np.ndarray, t: np.ndarray) -> Fit:
    """The fit with points that will be observed but are not yet (members already running a
    configuration, configurations chosen earlier in the same round), each at its predicted mean:
    the mean is unchanged, the variance there shrinks (GP-BUCB, Desautels et al., 2014), so
    later choices of a round spread out instead of all landing on one point. The fit's Cholesky
    factor is extended by the new points' block, not factorized again."""
    if len(x) == 0:
        return model
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    cross = kernel(model.x, model.t, x, t, model.length_scale, model.epsilon)  # (n, p)
    below = scipy.linalg.solve_triangular(model.cholesky, cross, lower=True, check_finite=False)
    own = kernel(x, t, x, t, model.length_scale, model.epsilon) + model.noise * np.eye(len(x))
    corner = scipy.linalg.cholesky(own - below.T @ below, lower=True, check_finite=False)
    n, p = len(model.x), len(x)
    cholesky = np.zeros((n + p, n + p))
    cholesky[:n, :n], cholesky[n:, :n], cholesky[n:, n:] = model.cholesky, below.T, corner
    targets = np.concatenate(
        [
            model.cholesky @ (model.cholesky.T @ model.alpha),
            cross.T @ model.alpha,  # the predicted means, standardized (`predict`'s)
        ]
    )
    alpha = scipy.linalg.cho_solve((cholesky, True), targets, check_finite=False)
    all_x, all_t = np.concatenate([model.x, x]), np.concatenate([model.t, t])
    return model._replace(x=all_x, t=all_t, cholesky=cholesky, alpha=alpha)


def predict(model: Fit, x: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) at each (x, t), in the units of y."""
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    cross = kernel(x, t, model.x, model.t, model.length_scale, model.epsilon)
    mean = cross @ model.alpha
    solved = scipy.linalg.solve_triangular(model.cholesky, cross.T, lower=True, check_finite=False)
    variance = np.maximum(1.0 - np.sum(solved**2, axis=0), 1e-12)
    return mean * model.y_scale + model.y_center, np.sqrt(variance) * model.y_scale

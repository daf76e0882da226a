"""Aggregate statistics of many training runs with stratified bootstrap confidence intervals.

The statistics of Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical
Precipice" (NeurIPS 2021), whose library rliable (google-research/rliable) is the reference:

    iqm                 interquartile mean: the mean of the middle half of the sorted scores
                        (floor(n / 4) cut at each end, as scipy.stats.trim_mean(scores, 0.25))
    mean, median        over every run
    optimality_gap      mean of max(gamma - score, 0): how far runs fall short of `gamma`
    performance_profile fraction of runs with a score above each threshold

A "run" is one trained agent (in fastpop: one member) and a "stratum" a set of runs that belong
together (a task, an environment, a run directory); `interval_estimates` resamples runs with
replacement within each stratum, never across strata, and reads percentile intervals off the
resampled statistics. Every statistic pools all runs of all strata, so each run weighs the same
(with equally many runs per stratum, as in a sweep, this equals rliable's estimates, except the
median: rliable's is the median of per-task means, which with one task is the mean; here it is
the median of the runs).

Why not rliable itself: it pulls in arch, scipy, absl and seaborn (and their own pins) for what
is about a hundred lines of numpy here, and its bootstrap calls the statistic once per resample
in Python, where here all resamples are one indexed array (in chunks). Every point of a curve
sees the same resampled runs, as in rliable's sample-efficiency curves. Scores are float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

CONFIDENCE = 0.95
REPETITIONS = 2000  # bootstrap resamples; rliable's examples use 2000 to 50000
CHUNK_ELEMENTS = 1 << 22  # resampled scores held at once (32 MiB of float64)


def iqm(scores: np.ndarray) -> np.ndarray:
    """Interquartile mean over the last axis: floor(n / 4) lowest and highest cut, the rest
    averaged (n < 4 cuts nothing)."""
    scores = np.sort(np.asarray(scores, np.float64), axis=-1)
    n = scores.shape[-1]
    cut = n // 4
    return scores[..., cut : n - cut].mean(axis=-1)


def mean(scores: np.ndarray) -> np.ndarray:
    return np.asarray(scores, np.float64).mean(axis=-1)


def median(scores: np.ndarray) -> np.ndarray:
    return np.median(np.asarray(scores, np.float64), axis=-1)


def optimality_gap(scores: np.ndarray, gamma: float) -> np.ndarray:
    """Mean shortfall from `gamma` over the last axis; scores above gamma count as gamma."""
    return np.maximum(gamma - np.asarray(scores, np.float64), 0.0).mean(axis=-1)


def performance_profile(scores: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Fraction of runs (last axis) scoring strictly above each threshold: shape (..., K)."""
    scores = np.asarray(scores, np.float64)[..., None, :]
    return (scores > np.asarray(thresholds, np.float64)[:, None]).mean(axis=-1)


def statistics(gamma: float) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The four aggregate statistics by name (the optimality gap with respect to `gamma`)."""
    return {
        "iqm": iqm,
        "mean": mean,
        "median": median,
        "optimality_gap": lambda scores: optimality_gap(scores, gamma),
    }


def stratified_indices(strata: np.ndarray, repetitions: int, rng: np.random.Generator):
    """(repetitions, runs) indices: each resample draws, for every stratum, as many of that
    stratum's runs as it has, with replacement, and only from that stratum."""
    strata = np.asarray(strata)
    columns = []
    for label in np.unique(strata):  # sorted: the same draws for the same seed
        members = np.flatnonzero(strata == label)
        columns.append(members[rng.integers(0, len(members), (repetitions, len(members)))])
    return np.concatenate(columns, axis=1)


class Estimate(NamedTuple):
    """A statistic on the data (`point`) and its percentile confidence interval."""

    point: np.ndarray
    low: np.ndarray
    high: np.ndarray


def interval_estimates(
    scores: np.ndarray,
    strata: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    repetitions: int = REPETITIONS,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> Estimate:
    """`statistic` of `scores` (..., runs) over the last axis, with a stratified bootstrap
    percentile interval. Every leading index (a point of a curve) sees the same resampled runs.
    `strata` (runs,) labels each run's stratum. The same seed gives the same interval."""
    scores = np.asarray(scores, np.float64)
    strata = np.asarray(strata)
    if scores.shape[-1] == 0 or strata.shape != scores.shape[-1:]:
        raise ValueError(
            f"interval_estimates: need one stratum label per run, got {strata.shape[0]} labels "
            f"for scores of shape {scores.shape}"
        )
    if not 0 < confidence < 1 or repetitions < 1:
        raise ValueError(f"confidence must be in (0, 1) and repetitions >= 1, got {confidence}")
    rng = np.random.default_rng(seed)
    indices = stratified_indices(strata, repetitions, rng)
    axis = scores.ndim - 1  # where the resample axis lands after fancy indexing
    chunk = max(1, CHUNK_ELEMENTS // max(scores.size, 1))
    resampled = [
        np.moveaxis(statistic(scores[..., indices[start : start + chunk]]), axis, 0)
        for start in range(0, repetitions, chunk)
    ]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(np.concatenate(resampled), [tail, 100 - tail], axis=0)
    return Estimate(statistic(scores), low, high)

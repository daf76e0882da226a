"""The samples-per-insert rate limiter: no deadlock, the target ratio held, nothing before min_size.

Pure host-side unit tests: a simulated collector and learner take turns in random order, each
acting only when the limiter allows it, as `fastpop.train` does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastpop.replay import RateLimiter

# (samples_per_insert, tolerance, samples_per_call, insert_size): the CPU presets (one update per
# env step, K=50 updates of batch 128, 32-row chunks), a call far larger than an insert (Atari:
# K=50 x 32 samples per call vs 0.25 x 32 per chunk), a fractional ratio, and no tolerance.
LIMITS = [
    (128.0, 0.2, 50 * 128, 32),
    (0.25 * 32, 0.1, 50 * 32, 32),
    (2.5, 0.2, 8, 5),
    (64.0, 0.0, 10 * 64, 32),
]
# Probability that the collector, else the learner, is the one that tries to act at a tick.
SPEEDS = {"fast collector, slow learner": 0.95, "slow collector, fast learner": 0.05, "even": 0.5}


def limit_id(limit) -> str:
    return "spi={}-tol={}-call={}-insert={}".format(*limit)


def bound(limiter: RateLimiter, learning_inserts: int) -> float:
    """Largest |sampled - target| the limiter's contract allows after `learning_inserts`."""
    minimum = limiter.samples_per_insert * limiter.insert_size + limiter.samples_per_call
    return max(limiter.tolerance * limiter.samples_per_insert * learning_inserts, minimum)


def simulate(limiter: RateLimiter, collector_share: float, ticks: int, seed: int):
    """Random interleaving; asserts the no-deadlock and ratio invariants at every tick."""
    rng = np.random.default_rng(seed)
    inserts = samples = 0
    for _ in range(ticks):
        insert_ok, sample_ok = limiter.can_insert(), limiter.can_sample()
        if limiter.learning:
            assert insert_ok or sample_ok, (
                f"deadlock: neither may act (inserted {limiter.inserted}, sampled "
                f"{limiter.sampled})"
            )
        else:
            assert not sample_ok and limiter.sampled == 0
            assert insert_ok
        if rng.random() < collector_share:
            if insert_ok:
                limiter.record_insert()
                inserts += 1
        elif sample_ok:
            limiter.record_sample()
            samples += 1
        if limiter.learning:
            learning_inserts = limiter.inserted - limiter.inserted_at_start
            target = limiter.samples_per_insert * learning_inserts
            assert abs(limiter.sampled - target) <= bound(limiter, learning_inserts) + 1e-6
    return inserts, samples


def test_nothing_samples_before_min_size():
    limiter = RateLimiter(8.0, min_size=100, tolerance=0.2, samples_per_call=64, insert_size=32)
    for inserted in (32, 64, 96):
        assert limiter.can_insert() and not limiter.can_sample() and not limiter.learning
        limiter.record_insert()
        assert limiter.inserted == inserted
        assert math.isnan(limiter.achieved_samples_per_insert)
    assert not limiter.can_sample()
    limiter.record_insert()  # 128 >= 100: learning starts; what came before is not owed samples
    assert limiter.learning and limiter.inserted_at_start == 128
    assert math.isnan(limiter.achieved_samples_per_insert)
    assert limiter.can_sample()


def test_achieved_ratio_counts_from_the_start_of_learning():
    limiter = RateLimiter(4.0, min_size=16, tolerance=0.2, samples_per_call=16, insert_size=8)
    for _ in range(3):  # 24 inserted, learning started at 16
        limiter.record_insert()
    limiter.record_sample()
    assert limiter.achieved_samples_per_insert == pytest.approx(16 / 8)


@pytest.mark.parametrize("speed", SPEEDS, ids=list(SPEEDS))
@pytest.mark.parametrize("limit", LIMITS, ids=limit_id)
def test_random_interleavings_never_deadlock_and_hold_the_ratio(limit, speed):
    samples_per_insert, tolerance, samples_per_call, insert_size = limit
    min_size = 10 * insert_size
    for seed in range(3):
        limiter = RateLimiter(
            samples_per_insert, min_size, tolerance, samples_per_call, insert_size
        )
        inserts, samples = simulate(limiter, SPEEDS[speed], ticks=20_000, seed=seed)
        # Both sides made progress: the fast one was held back, not the slow one starved.
        assert inserts > 100 and samples > 100, (inserts, samples)
        learning_inserts = limiter.inserted - limiter.inserted_at_start
        achieved = limiter.achieved_samples_per_insert
        allowed = bound(limiter, learning_inserts) / learning_inserts
        assert abs(achieved - samples_per_insert) <= allowed + 1e-9
        if tolerance > 0:
            # Enough data flowed for the tolerance, not the one-call minimum, to be the bound.
            assert allowed == pytest.approx(tolerance * samples_per_insert)
            assert abs(achieved - samples_per_insert) <= tolerance * samples_per_insert + 1e-9


def test_the_fast_side_waits_at_the_edge_of_the_tolerance():
    """A collector that always may insert runs the ratio down to target*(1-tol), no further."""
    limiter = RateLimiter(16.0, min_size=64, tolerance=0.25, samples_per_call=64, insert_size=16)
    while limiter.can_insert():
        limiter.record_insert()
        assert limiter.inserted < 10_000, "the limiter never stopped a collector with no learner"
    while not limiter.can_insert():
        assert limiter.can_sample()
        limiter.record_sample()
    # And the converse: a learner alone is stopped once it is ahead by the tolerance.
    for _ in range(1_000):
        limiter.record_insert()
    while limiter.can_sample():
        limiter.record_sample()
    learning_inserts = limiter.inserted - limiter.inserted_at_start
    ahead = limiter.sampled - 16.0 * learning_inserts
    assert 0 < ahead <= 0.25 * 16.0 * learning_inserts
    assert limiter.can_insert()

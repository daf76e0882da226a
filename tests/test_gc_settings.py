"""The garbage collector's setting for fastpop's own processes (fastpop/gc_settings.py)."""

from __future__ import annotations

import gc

import pytest

from fastpop.gc_settings import YOUNGEST_THRESHOLD, tune_for_tracing


@pytest.fixture
def restored_thresholds():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((700, 10, 10), (YOUNGEST_THRESHOLD, 10, 10)),  # CPython's default: raised
        ((700, 5, 20), (YOUNGEST_THRESHOLD, 5, 20)),  # the older generations' as they were
        ((10 * YOUNGEST_THRESHOLD, 10, 10), (10 * YOUNGEST_THRESHOLD, 10, 10)),  # rarer: kept
        ((0, 10, 10), (0, 10, 10)),  # automatic collection off: left off
    ],
)
def test_youngest_generation_collected_less_often(restored_thresholds, before, after):
    gc.set_threshold(*before)
    tune_for_tracing()
    assert gc.get_threshold() == after

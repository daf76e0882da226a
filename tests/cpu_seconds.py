"""`--cpu-seconds N`: the N tests that took the most CPU seconds (this process's threads, XLA's
compiles included, and every child process it waited for: `fastpop train`, collectors, the
distributed tests' processes), summed over setup, call and teardown, printed at the end of the
session. Wall time (`--durations`) hides where a cold suite spends its 2 cores: a test waiting
on a subprocess and a test compiling look alike there. Works with pytest-xdist (each worker
sends its tests' figures with their reports) and with `-n 0`."""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

FIELD = "cpu_seconds"
_totals: defaultdict[str, float] = defaultdict(float)


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-seconds",
        type=int,
        default=0,
        metavar="N",
        help="show the N tests that took the most CPU seconds (children included)",
    )


def cpu_now() -> float:
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def record(report: pytest.TestReport, seconds: float) -> None:
    """On the process that ran the phase: its CPU seconds travel with its report."""
    report.user_properties.append((FIELD, seconds))


def collect(report: pytest.TestReport) -> None:
    """On the process that reports (xdist's controller, or the only one)."""
    for name, value in report.user_properties:
        if name == FIELD:
            _totals[report.nodeid] += value


def summary(terminal, count: int) -> None:
    if not count or not _totals:
        return
    terminal.write_sep("=", f"{count} tests with the most CPU seconds (children included)")
    total = sum(_totals.values())
    for nodeid, seconds in sorted(_totals.items(), key=lambda item: -item[1])[:count]:
        terminal.write_line(f"{seconds:8.1f} s  {nodeid}")
    terminal.write_line(f"{total:8.1f} s  in all, {len(_totals)} tests")

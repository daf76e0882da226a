"""The one registry of population strategies: name -> `StrategyEntry` (factory, config section,
its checks, and the capabilities the run, progress lines, `fastpop eval`, `fastpop plot` and
`fastpop pbt-replay` read).

Code outside a strategy's own module asks this registry, never for a strategy by name:
`get(config.strategy).fresh_trials`, not `config.strategy == "halving"`. The built-in entries
come from their modules (`pbt.ENTRY`, ...); `register` adds one at run time (a plugin, a test's
toy strategy).
"""

from __future__ import annotations

from fastpop.registry import Registry
from fastpop.strategies import (
    branch_merge,
    cemrl,
    dvd,
    halving,
    independent,
    mfpbt,
    pb2,
    pbt,
    schedule,
)
from fastpop.strategies.base import StrategyEntry

DEFAULT = independent.ENTRY.name  # a config's strategy when it names none: members left alone


def _check(entry: StrategyEntry) -> None:
    if entry.mean_member is not None and not entry.mean_member.label:
        raise ValueError(f"strategy {entry.name!r}: its mean member needs a label")


_REGISTRY = Registry("strategy", _check)
register, unregister, get = _REGISTRY.register, _REGISTRY.unregister, _REGISTRY.get
find, entries, names_with = _REGISTRY.find, _REGISTRY.entries, _REGISTRY.names_with
NAMES = _REGISTRY.names  # live: a config field's choices that follows `register`

for _module in (independent, pbt, pb2, mfpbt, halving, branch_merge, cemrl, dvd, schedule):
    register(_module.ENTRY)

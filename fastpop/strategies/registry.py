"""The one registry of population strategies: name -> `StrategyEntry` (factory, config section,
its checks, and the capabilities the run, progress lines, `fastpop eval`, `fastpop plot` and
`fastpop pbt-replay` read).

Code outside a strategy's own module asks this registry, never for a strategy by name:
`get(config.strategy).fresh_trials`, not `config.strategy == "halving"`. The built-in entries
come from their modules (`pbt.ENTRY`, ...); `register` adds one at run time (a plugin, a test's
toy strategy).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastpop.strategies import (
    branch_merge,
    cemrl,
    dvd,
    halving,
    independent,
    pb2,
    pbt,
    schedule,
)
from fastpop.strategies.base import StrategyEntry

DEFAULT = independent.ENTRY.name  # a config's strategy when it names none: members left alone

_ENTRIES: dict[str, StrategyEntry] = {}


def register(entry: StrategyEntry, replace: bool = False) -> StrategyEntry:
    """Add `entry` under its name; a name already taken is refused unless `replace`."""
    if entry.name in _ENTRIES and not replace:
        raise ValueError(f"strategy {entry.name!r} is registered already (replace=True swaps it)")
    if entry.mean_member is not None and not entry.mean_label:
        raise ValueError(f"strategy {entry.name!r}: a mean_member needs a mean_label")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a run-time entry (a test's toy strategy); unknown names are ignored."""
    _ENTRIES.pop(name, None)


def get(name: str) -> StrategyEntry:
    """The entry of strategy `name`; a ValueError names the known ones."""
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(NAMES)}") from None


def find(name: object) -> StrategyEntry | None:
    """The entry of strategy `name`, or None (a run directory written elsewhere, an old name)."""
    return _ENTRIES.get(name) if isinstance(name, str) else None


def entries() -> tuple[StrategyEntry, ...]:
    """Every registered entry, in registration order (the built-ins first)."""
    return tuple(_ENTRIES.values())


def names_with(**wanted) -> tuple[str, ...]:
    """Names of the entries whose fields equal `wanted`, e.g. names_with(shared_critic=True)."""
    return tuple(
        e.name for e in _ENTRIES.values() if all(getattr(e, k) == v for k, v in wanted.items())
    )


class _Names:
    """The registered names, live: a config field's `choices` that follows `register`."""

    def __contains__(self, name: object) -> bool:
        return name in _ENTRIES

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_ENTRIES))

    def __len__(self) -> int:
        return len(_ENTRIES)

    def __repr__(self) -> str:
        return repr(tuple(_ENTRIES))


NAMES = _Names()

for _module in (independent, pbt, pb2, halving, branch_merge, cemrl, dvd, schedule):
    register(_module.ENTRY)

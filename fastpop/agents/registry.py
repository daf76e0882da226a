"""The one registry of algorithms: name -> `AlgorithmEntry` (agent factory, config type, action
kind, numpy policy, export description, shared-critic capability).

Code outside an algorithm's own module asks this registry, never for an algorithm by name:
`get(config.algo).actions`, not `config.algo == "dqn"`. The built-in entries come from their
modules (`td3.ENTRY`, ...); `register` adds one at run time (a plugin, a test's toy agent).
"""

from __future__ import annotations

from collections.abc import Iterator

from fastpop.agents import dqn, sac, td3
from fastpop.agents.base import ACTION_KINDS, AlgorithmEntry

DEFAULT = td3.ENTRY.name  # a config's algo when it names none

_ENTRIES: dict[str, AlgorithmEntry] = {}


def register(entry: AlgorithmEntry, replace: bool = False) -> AlgorithmEntry:
    """Add `entry` under its name; a name already taken is refused unless `replace`."""
    if entry.actions not in ACTION_KINDS:
        raise ValueError(
            f"algorithm {entry.name!r}: actions must be one of {', '.join(ACTION_KINDS)}, "
            f"got {entry.actions!r}"
        )
    if entry.name in _ENTRIES and not replace:
        raise ValueError(f"algorithm {entry.name!r} is registered already (replace=True swaps it)")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove a run-time entry (a test's toy algorithm); unknown names are ignored."""
    _ENTRIES.pop(name, None)


def get(name: str) -> AlgorithmEntry:
    """The entry of algorithm `name`; a ValueError names the known ones."""
    try:
        return _ENTRIES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(NAMES)}") from None


def entries() -> tuple[AlgorithmEntry, ...]:
    """Every registered entry, in registration order (the built-ins first)."""
    return tuple(_ENTRIES.values())


def names_with(**wanted) -> tuple[str, ...]:
    """Names of the entries whose fields equal `wanted`, e.g. names_with(actions="discrete")."""
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

for _entry in (td3.ENTRY, sac.ENTRY, dqn.ENTRY):
    register(_entry)

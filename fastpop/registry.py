"""A registry of named entries: what `fastpop.agents.registry` (algorithms) and
`fastpop.strategies.registry` (strategies) each hold one of. An entry is a NamedTuple with a
`name`; code asks the registry for an entry or for the names whose fields match, never for a
built-in by name, so an entry registered at run time (a plugin, a test's toy) is a first-class
one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


class Names:
    """A registry's names, live: a config field's `choices` that follows `register`."""

    def __init__(self, entries: dict[str, Any]):
        self._entries = entries

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return repr(tuple(self._entries))


class Registry:
    """name -> entry, in registration order; `kind` names the entries in messages, `check`
    refuses a malformed entry (ValueError) before it is registered."""

    def __init__(self, kind: str, check: Callable[[Any], None] = lambda entry: None):
        self.kind, self.check = kind, check
        self._entries: dict[str, Any] = {}
        self.names = Names(self._entries)

    def register(self, entry, replace: bool = False):
        """Add `entry` under its name; a name already taken is refused unless `replace`."""
        self.check(entry)
        if entry.name in self._entries and not replace:
            raise ValueError(
                f"{self.kind} {entry.name!r} is registered already (replace=True swaps it)"
            )
        self._entries[entry.name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove a run-time entry (a test's toy); unknown names are ignored."""
        self._entries.pop(name, None)

    def get(self, name: str):
        """The entry of `name`; a ValueError names the known ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            known = ", ".join(self.names)
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {known}") from None

    def find(self, name: object):
        """The entry of `name`, or None (a run directory written elsewhere, an old name)."""
        return self._entries.get(name) if isinstance(name, str) else None

    def entries(self) -> tuple:
        """Every registered entry, in registration order (the built-ins first)."""
        return tuple(self._entries.values())

    def names_with(self, **wanted) -> tuple[str, ...]:
        """Names of the entries whose fields equal `wanted`, e.g. names_with(actions="discrete")."""
        return tuple(
            name
            for name, entry in self._entries.items()
            if all(getattr(entry, key) == value for key, value in wanted.items())
        )

"""The one registry of algorithms: name -> `AlgorithmEntry` (agent factory, config type, action
kind, numpy policy, export description, shared-critic capability).

Code outside an algorithm's own module asks this registry, never for an algorithm by name:
`get(config.algo).actions`, not `config.algo == "dqn"`. The built-in entries come from their
modules (`td3.ENTRY`, ...); `register` adds one at run time (a plugin, a test's toy agent).
"""

from __future__ import annotations

from fastpop.agents import dqn, sac, td3
from fastpop.agents.base import ACTION_KINDS, AlgorithmEntry
from fastpop.registry import Registry

DEFAULT = td3.ENTRY.name  # a config's algo when it names none


def _check(entry: AlgorithmEntry) -> None:
    if entry.actions not in ACTION_KINDS:
        raise ValueError(
            f"algorithm {entry.name!r}: actions must be one of {', '.join(ACTION_KINDS)}, "
            f"got {entry.actions!r}"
        )


_REGISTRY = Registry("algorithm", _check)
register, unregister, get = _REGISTRY.register, _REGISTRY.unregister, _REGISTRY.get
entries, names_with = _REGISTRY.entries, _REGISTRY.names_with
NAMES = _REGISTRY.names  # live: a config field's choices that follows `register`

for _entry in (td3.ENTRY, sac.ENTRY, dqn.ENTRY):
    register(_entry)

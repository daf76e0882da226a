"""`plugins:` the Python modules a config imports before the rest of it is read.

An algorithm, strategy or env family that is not part of fastpop registers itself from a
module of its own (`fastpop.agents.registry.register`, `fastpop.strategies.registry.register`,
`fastpop.envs.device_envs.FAMILIES`). Naming that module in the config makes every process of
the run import it: the learner, the collector and evaluator processes (they read the same
config) and a resume. Importing runs the module's code, as running a Python file would.
"""

from __future__ import annotations

import importlib

from fastpop.schema import Reader


def import_plugins(r: Reader, modules: tuple[str, ...]) -> None:
    """Imports each of `modules`; a ConfigError naming the one that failed and why."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # whatever the module raised: the user's to fix
            r.fail("plugins", f"cannot import {name!r}: {type(error).__name__}: {error}")

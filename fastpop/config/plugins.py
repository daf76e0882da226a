"""`plugins:` the Python modules a config imports before the rest of it is read.

An algorithm, strategy or device env family that is not part of fastpop registers itself from
a module of its own (`fastpop.agents.registry.register`, `fastpop.strategies.registry.register`,
`fastpop.envs.device_envs.register(adapter)`). Naming that module in the config makes every
process of the run import it: the learner, the collector and evaluator processes (their
`AgentRecipe` names the modules: fastpop.collect.collector.rebuild_agent) and a resume.
Importing runs the module's code, as running a Python file would.
The config is read after its plugins are imported, so a plugin family's ids and backends are
accepted as the built-ins' are.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

from fastpop.schema import Reader


def import_plugins(r: Reader, modules: tuple[str, ...]) -> None:
    """Imports each of `modules`; a ConfigError naming the one that failed and why."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # whatever the module raised: the user's to fix
            r.fail("plugins", f"cannot import {name!r}: {type(error).__name__}: {error}")


def plugin_sources(modules: tuple[str, ...]) -> dict[str, str]:
    """Per plugin module (imported by `import_plugins`), a hash of its source: a package's
    every .py file. What device mode's stored programs are keyed by besides fastpop's own
    sources (run/parts.program_identity): an edited plugin is traced again, never loaded stale."""
    hashes = {}
    for name in modules:
        path = Path(getattr(sys.modules.get(name), "__file__", None) or "")
        files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
        digest = hashlib.sha256()
        for file in files:
            if file.is_file():
                digest.update(file.name.encode() + b"\0" + file.read_bytes())
        hashes[name] = digest.hexdigest()
    return hashes

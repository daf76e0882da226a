"""Loaded by every Python process a test starts under `--cpu-seconds` (tests/child_stages.py
puts this directory first on PYTHONPATH): at exit the process writes its CPU seconds and the
seconds it spent in JAX's three compile stages, with the test that started it, as one JSON
file into FASTPOP_TEST_CHILD_STAGES. It imports nothing heavy and listens for the stages only
once the process itself imports JAX's monitoring module. A process killed by a signal writes
nothing (its CPU seconds still reach the test's own figure, through its parent's wait)."""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import resource
import sys

DIRECTORY = "FASTPOP_TEST_CHILD_STAGES"
MONITORING = "jax._src.monitoring"
STAGES = {  # JAX's monitoring events of a program's compile stages (jax/_src/dispatch.py)
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "xla",
}
_seconds = dict.fromkeys(STAGES.values(), 0.0)


def _on_duration(event: str, duration_secs: float, **_metadata) -> None:
    if (stage := STAGES.get(event)) is not None:
        _seconds[stage] += duration_secs


class _ListenOnImport(importlib.abc.MetaPathFinder):
    """Registers `_on_duration` as JAX's monitoring module is imported (before any compile)."""

    def find_spec(self, name, path, target=None):
        if name != MONITORING:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            module.register_event_duration_secs_listener(_on_duration)

        spec.loader.exec_module = exec_module
        return spec


def _write() -> None:
    # A test's processes see the test's PYTEST_CURRENT_TEST; pytest's own worker processes have
    # none left at their exit, and their figures travel with their reports instead.
    test, directory = os.environ.get("PYTEST_CURRENT_TEST"), os.environ.get(DIRECTORY)
    if not test or not directory:
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record = {
        "test": test.rsplit(" (", 1)[0],  # "tests/test_a.py::b (call)" -> its node id
        "cpu": usage.ru_utime + usage.ru_stime,
        "jax": MONITORING in sys.modules,
        **_seconds,
    }
    try:
        with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as file:
            json.dump(record, file)
    except OSError:  # the session has ended and removed the directory
        pass


def _run_the_next_sitecustomize() -> None:
    """This module shadows any other `sitecustomize` on the path: that one still runs."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get(DIRECTORY):
    sys.meta_path.insert(0, _ListenOnImport())
    atexit.register(_write)
_run_the_next_sitecustomize()

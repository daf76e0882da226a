"""The compile stages of the processes the tests start, for `--cpu-seconds` (tests/cpu_seconds.py).

A test's own process reports its tracing, lowering and XLA seconds from JAX's monitoring events;
the processes it starts (`fastpop train`, the `--distributed` runs, the GPU programme's phases,
collectors) reach its figure only as CPU seconds, through the parent's wait. Under
`--cpu-seconds` the session puts `tests/child_process_site` first on PYTHONPATH, so that each
of them loads its `sitecustomize` and, at exit, writes its CPU seconds and stages with the test
that started it (its inherited PYTEST_CURRENT_TEST) into a directory of the session's own,
which the summary reads and removes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

SITE = Path(__file__).resolve().parent / "child_process_site"
DIRECTORY = "FASTPOP_TEST_CHILD_STAGES"  # as child_process_site/sitecustomize.py reads it
STAGES = ("trace", "lower", "xla")


def start(config) -> None:
    """On the process that reports, before pytest-xdist starts its workers (whose environment,
    and so their tests' processes', is this process's)."""
    directory = tempfile.mkdtemp(prefix="fastpop-test-child-stages-")
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    os.environ[DIRECTORY] = directory
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *([path] if path else [])])


def records() -> list[dict]:
    """What the tests' processes that have exited wrote (none where `start` did not run)."""
    directory = os.environ.get(DIRECTORY)
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for entry in sorted(Path(directory).glob("*.json")):
        try:
            found.append(json.loads(entry.read_text()))
        except (OSError, ValueError):  # a process that died while writing it
            continue
    return found


def totals_line(found: list[dict]) -> str:
    """One line on all of them: how many, their CPU seconds, and their stages'."""
    with_jax = [record for record in found if record["jax"]]
    cpu = sum(record["cpu"] for record in found)
    seconds = {stage: sum(record[stage] for record in found) for stage in STAGES}
    return (
        f"the processes the tests started: {len(found)} that exited on their own "
        f"({len(with_jax)} imported JAX), {cpu:.1f} CPU-s, of which tracing "
        f"{seconds['trace']:.1f}, lowering {seconds['lower']:.1f} and XLA {seconds['xla']:.1f}"
    )

"""Measured performance choices (members per chunk, ...) kept per machine, in memory and on disk.

An entry is keyed by what it was measured for (the program's shapes, the population size) and
by the machine and software that measured it (CPU model and cores, backend, jax version,
XLA_FLAGS), so a cache shared between machines, or kept across an upgrade, is never reused for
the wrong one. The file is $FASTPOP_CACHE_DIR/tuning.json (default: $XDG_CACHE_HOME/fastpop, or
~/.cache/fastpop); FASTPOP_CACHE_DIR="" keeps entries in memory only. Delete the file to
measure again (e.g. after measuring on a loaded machine).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import jax

from fastpop.compilation import compile_cache
from fastpop.machine import usable_cores

_memory: dict[str, dict] = {}


@functools.cache
def machine() -> str:
    """CPU model, usable cores, backend and software: what a measurement is only valid for."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = usable_cores()
    device = jax.devices()[0]
    return (
        f"{model} x{cores} | {device.platform} {device.device_kind} | jax {jax.__version__} "
        f"| XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}"
    )


def key(*what: str) -> str:
    text = " | ".join([*what, machine()])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def path() -> Path | None:
    directory = compile_cache.user_cache_dir()
    return directory / "tuning.json" if directory is not None else None


def _read(file: Path) -> dict:
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return {}


def load(entry_key: str) -> dict | None:
    if entry_key in _memory:
        return _memory[entry_key]
    file = path()
    entry = _read(file).get(entry_key) if file is not None else None
    if entry is not None:
        _memory[entry_key] = entry
    return entry


def store(entry_key: str, entry: dict, persist: bool = True) -> None:
    """Keep `entry` in memory and, with `persist`, on disk, best effort (a read-only home only
    loses the disk copy; concurrent writers may drop each other's entry, never corrupt it)."""
    _memory[entry_key] = entry
    file = path()
    if file is None or not persist:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(file)
        entries[entry_key] = {**entry, "machine": machine()}
        with tempfile.NamedTemporaryFile("w", dir=file.parent, delete=False) as handle:
            try:
                json.dump(entries, handle, indent=1, default=str)
                handle.close()
                os.replace(handle.name, file)
            except BaseException:
                os.unlink(handle.name)
                raise
    except OSError:
        pass

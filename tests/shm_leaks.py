"""What a test session leaves in /dev/shm: fastpop segments nobody will unlink and
multiprocessing's named semaphores (`sem.mp-*`), which nothing removes once their run is gone."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastpop.collect.segments import SHM_DIRECTORY, owner_alive, parse_owner


def shm_entries(directory: Path = SHM_DIRECTORY) -> set[str]:
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


def _mapped_by_a_live_process() -> set[str]:
    """Names of /dev/shm files some live process has mapped (an open named semaphore is)."""
    mapped = set()
    for entry in os.listdir("/proc"):
        try:
            maps = Path(f"/proc/{entry}/maps").read_text() if entry.isdigit() else ""
        except OSError:  # gone, or not ours to read
            continue
        mapped |= {line.rsplit("/", 1)[-1] for line in maps.splitlines() if "/dev/shm/" in line}
    return mapped


def _leaked(name: str, directory: Path, mapped: set[str]) -> bool:
    if name.startswith("sem.mp-"):
        # Nothing in a semaphore names its creator; one still mapped belongs to a live run
        # (another session's, on a shared machine), one nobody maps and nobody removes leaked.
        try:
            return name not in mapped and (directory / name).stat().st_uid == os.getuid()
        except FileNotFoundError:
            return False
    owner = parse_owner(name)
    if owner is None:
        return False
    # A live owner other than this process is a run still going (another session's).
    return owner.pid == os.getpid() or not owner_alive(owner, directory / name)


def leftovers(before: set[str], directory: Path = SHM_DIRECTORY, wait: float = 5.0) -> list[str]:
    """Entries created since `before` and leaked; waits up to `wait` s for resource trackers
    of runs that just ended to finish their cleanup."""
    deadline = time.monotonic() + wait
    while True:
        new, mapped = shm_entries(directory) - before, _mapped_by_a_live_process()
        left = sorted(name for name in new if _leaked(name, directory, mapped))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)

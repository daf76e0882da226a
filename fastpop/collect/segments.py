"""Shared-memory segments of a run: naming, ownership, the platform check, and orphan reclaim.

A segment is named `fastpop_<pid>_<pid namespace>_<start time>_<random>` after the process that
created it: its pid, the inode of its pid namespace and its start time in clock ticks since boot
(both 0 where /proc does not give them). The creator unlinks its segments when it leaves a
`with` block, and the resource tracker does when the creator dies alone; a run killed as a
whole (`kill -9 -- -PGID`: learner, workers and tracker together) leaves them in /dev/shm, and
`reclaim_orphaned_segments` removes them at the next start. A segment is only removed when its
creator is provably gone: no such pid, a zombie, or a pid now used by a process that started
at another time. Segments of another pid namespace (a container sharing /dev/shm) are never
touched, since their owners cannot be seen from here.

Memory ordering: the channels in `shm` need stores to become visible in program order and loads
not to be reordered with other loads (x86's total store order). `memory_order_problem` decides
from the CPU architecture whether that holds; creating or attaching a segment elsewhere raises.
"""

from __future__ import annotations

import os
import platform
import re
import secrets
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import NamedTuple

SEGMENT_PREFIX = "fastpop_"
SHM_DIRECTORY = Path("/dev/shm")
# x86 in all its spellings (Linux, macOS, Windows, 32-bit): total store order.
_TOTAL_STORE_ORDER = frozenset({"x86_64", "amd64", "x64", "i386", "i486", "i586", "i686", "x86"})
_NAME = re.compile(r"fastpop_(\d+)_(\d+)_(\d+)_[0-9a-f]+")
_LEGACY_NAME = re.compile(r"fastpop_(\d+)_[0-9a-f]{8}")  # before the owner was in the name


class WeakMemoryOrderError(RuntimeError):
    """Shared-memory collection refused on a CPU that reorders memory accesses."""


def memory_order_problem(machine: str | None = None) -> str | None:
    """Why the channels cannot run on a CPU of architecture `machine` (default: this one's,
    `platform.machine()`), or None where they can: x86 only."""
    machine = platform.machine() if machine is None else machine
    if machine.lower() in _TOTAL_STORE_ORDER:
        return None
    return (
        f"fastpop's collector processes exchange parameters and transitions through shared "
        f"memory with a seqlock and rings that rely on x86's total store order; this CPU "
        f"({machine or 'unknown architecture'}) may reorder memory accesses (ARM: GH200, Apple "
        "silicon), and Python exposes no memory fence, so the learner and the collectors would "
        "silently read half-written data. Run process-mode collection on an x86-64 host."
    )


def require_total_store_order() -> None:
    problem = memory_order_problem()
    if problem is not None:
        raise WeakMemoryOrderError(problem)


class Owner(NamedTuple):
    """The process that created a segment, as recorded in its name."""

    pid: int
    namespace: int | None  # inode of its pid namespace; None: unknown (legacy name)
    start: int | None  # start time in clock ticks since boot; None: unknown (legacy name)


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a live or zombie process, None without one."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return fields[0], int(fields[19])


def own_owner() -> Owner:
    stat = _proc_stat(os.getpid())
    return Owner(os.getpid(), _pid_namespace(), 0 if stat is None else stat[1])


def segment_name(owner: Owner | None = None) -> str:
    owner = own_owner() if owner is None else owner
    return f"{SEGMENT_PREFIX}{owner.pid}_{owner.namespace}_{owner.start}_{secrets.token_hex(4)}"


def parse_owner(name: str) -> Owner | None:
    """The owner recorded in a fastpop segment's name; None for any other name."""
    if match := _NAME.fullmatch(name):
        return Owner(*(int(group) for group in match.groups()))
    if match := _LEGACY_NAME.fullmatch(name):
        return Owner(int(match.group(1)), None, None)
    return None


def _signal_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def owner_alive(owner: Owner, path: Path) -> bool:
    """Whether the process that created the segment at `path` may still be running; True
    whenever that cannot be ruled out."""
    if owner.namespace is not None and owner.namespace != _pid_namespace():
        return True  # its pids are not ours to look up
    stat = _proc_stat(owner.pid)
    if stat is None:
        return _signal_alive(owner.pid)  # no /proc entry; a hidden pid still answers signals
    state, start = stat
    if state in ("Z", "X"):
        return False  # killed, not yet reaped: it will never unlink anything
    if owner.start is not None:
        return start == owner.start  # another start time: the pid was reused
    return not _started_after(start, path)


def _started_after(start: int, path: Path) -> bool:
    """Whether a process that started `start` clock ticks after boot started after the file at
    `path` last changed, so it cannot have created it (for names without a start time)."""
    try:
        stat_lines = Path("/proc/stat").read_text().splitlines()
        boot = int(next(line for line in stat_lines if line.startswith("btime ")).split()[1])
        started = boot + start / os.sysconf("SC_CLK_TCK")
        return started > path.stat().st_ctime + 1.0  # btime is rounded to the second
    except (OSError, StopIteration, ValueError):
        return False


def reclaim_orphaned_segments(directory: Path = SHM_DIRECTORY) -> list[str]:
    """Unlinks the fastpop segments in `directory` whose creating process is gone; returns
    their names. Never touches a segment whose creator may be alive, nor other files."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:  # no /dev/shm (macOS): segments are not listable, nothing to reclaim
        return []
    removed = []
    for name in names:
        owner = parse_owner(name)
        path = Path(directory) / name
        if owner is None or owner_alive(owner, path):
            continue
        try:
            path.unlink()  # shm_unlink, without registering it with a resource tracker
        except (FileNotFoundError, PermissionError):  # raced, or another user's
            continue
        removed.append(name)
    return removed


def _attach_untracked(name: str) -> SharedMemory:
    # Before Python 3.13, attaching registers the segment with this process's resource tracker,
    # whose cleanup at exit unlinks (and warns about) segments it still holds, which destroys the
    # learner's segment when an independently started process exits. Unregistering right after
    # attaching is no fix under `spawn`: children share the parent's tracker, which keeps a set
    # of names, so the child's unregister would drop the owner's registration and the owner's
    # own unlink would then make the tracker print a KeyError. So attachers never register.
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    register = resource_tracker.register
    resource_tracker.register = lambda *args: None
    try:
        return SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class Segment:
    """Owns or attaches one segment; creators unlink on exit from a `with` block."""

    def __init__(self, shm: SharedMemory, owner: bool):
        self._shm, self._owner, self._closed, self._unlinked = shm, owner, False, False

    @staticmethod
    def _create_segment(size: int) -> SharedMemory:
        require_total_store_order()
        # Fresh segments read as zeros.
        return SharedMemory(name=segment_name(), create=True, size=size)

    @staticmethod
    def _attach_segment(name: str) -> SharedMemory:
        require_total_store_order()
        return _attach_untracked(name)

    @property
    def name(self) -> str:
        return self._shm.name

    def _drop_views(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Unmaps the segment in this process (idempotent); the channel is unusable after."""
        if not self._closed:
            self._drop_views()  # numpy views export the buffer; close() fails while they live
            self._shm.close()
            self._closed = True

    def unlink(self) -> None:
        """Removes the segment (creator only, idempotent); attached processes keep their map."""
        if not self._owner:
            raise RuntimeError(f"shared memory {self.name}: only the creating process unlinks it")
        if self._unlinked:
            return
        self._unlinked = True
        try:
            self._shm.unlink()
        except FileNotFoundError:  # already removed by hand: still stop tracking it
            resource_tracker.unregister(self._shm._name, "shared_memory")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        if self._owner:
            self.unlink()

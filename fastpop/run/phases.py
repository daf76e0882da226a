"""What the learner is doing: said while one of its calls takes longer than a progress
interval, and timed for the run's time breakdown.

The training loop prints a progress line between calls; a call that runs for a minute (the first
population update compiling on a CPU, a checkpoint with a large replay, waiting for the final
evaluation) would otherwise leave the terminal silent. `PhaseWatch` is a thread that, while a
named phase runs, logs `<phase> ... 12s` every interval, and `<phase>: done in 61s` at its end
when it said anything. `PhaseClock` adds each phase's seconds to the breakdown.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


def format_seconds(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


class PhaseWatch:
    """A context manager (it owns a daemon thread while entered); `phase(name)` marks a call."""

    def __init__(
        self,
        log: Callable[[str], None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.log, self.interval, self.clock = log, interval, clock
        self._lock = threading.Lock()
        self._phases: list[list] = []  # [name, start, last report or start, reported], nested
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PhaseWatch:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="fastpop-phases", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """While the body runs, it is what the watch reports (the innermost of nested ones)."""
        now = self.clock()
        entry = [name, now, now, False]
        with self._lock:
            self._phases.append(entry)
        try:
            yield
        finally:
            with self._lock:
                self._phases.remove(entry)
                if entry[3]:
                    self.log(f"{name}: done in {format_seconds(self.clock() - entry[1])}")

    def _watch(self) -> None:
        poll = min(self.interval / 4, 1.0)
        while not self._stop.wait(poll):
            with self._lock:
                if not self._phases:
                    continue
                entry = self._phases[-1]
                now = self.clock()
                if now - entry[2] >= self.interval:
                    entry[2], entry[3] = now, True
                    # Under the lock, so that it never comes after the phase's "done".
                    self.log(f"{entry[0]} ... {format_seconds(now - entry[1])}")


class PhaseClock:
    """Where a run's wall time goes: each moment counts for the innermost phase open then (a
    phase opened inside another pauses it), so that no second is counted twice and the phases'
    sum is the wall time less what no phase covered (`other` in the breakdown)."""

    def __init__(self, seconds: Callable[[], dict], clock: Callable[[], float] = time.monotonic):
        """`seconds`: the dict of seconds per phase to add to (the run's `RunProgress.timers`,
        which a resume replaces)."""
        self.seconds, self.clock = seconds, clock
        self._open: list[str] = []
        self._since = clock()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.lap()
        self._open.append(name)
        try:
            yield
        finally:
            self.lap()
            self._open.pop()

    def lap(self) -> None:
        """The seconds since the last lap to the phase open through them (the seconds are
        then counted up to now)."""
        now = self.clock()
        if self._open:
            seconds = self.seconds()
            seconds[self._open[-1]] = seconds.get(self._open[-1], 0.0) + now - self._since
        self._since = now

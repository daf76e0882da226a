"""Ctrl-C and SIGTERM for a training run: stop at a safe point, with a checkpoint.

From the loop on, the first signal asks for a stop at the loop's next check (the state is
consistent there, so the stop checkpoint can be written). A signal within REPEAT_SECONDS of it is
the same request delivered twice (to the whole process group, or forwarded by a wrapper such as
`timeout` or a batch system) and is ignored; a later one stops at once, without the checkpoint.
Before the loop every signal stops at once.
"""

from __future__ import annotations

import signal
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_SECONDS = 1.0  # a second stop signal sooner than this is the first one delivered again


class StopRequested(Exception):
    """SIGTERM: stop like Ctrl-C does."""


def stop_exception(signum: int) -> BaseException:
    return StopRequested() if signum == signal.SIGTERM else KeyboardInterrupt()


class StopSignals:
    """Installs the stop handlers for the duration of a `with` block (restoring the previous
    ones after it)."""

    def __init__(self):
        self.signal: int | None = None  # SIGINT / SIGTERM received
        self.requested_at = 0.0
        self.in_loop = False  # from the loop on, a signal stops at the next safe point
        self.stopped_at_once = False
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        self.in_loop = False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum, frame) -> None:
        """Raising is remembered too: an exception raised while Python runs a finalizer or a
        gc callback (e.g. XLA's) is printed and dropped, and the loop must still stop."""
        now = time.monotonic()
        if self.in_loop:
            if self.signal is None:
                self.signal, self.requested_at = signum, now
                return
            if now - self.requested_at < REPEAT_SECONDS:
                return
            self.stopped_at_once = True
        self.signal = signum
        raise stop_exception(signum)

    def check(self) -> None:
        """Raise the requested stop here, at a safe point of the loop."""
        if self.signal is not None:
            raise stop_exception(self.signal)

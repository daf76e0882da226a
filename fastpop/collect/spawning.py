"""How a worker process (fastpop.collect.workers) is started: from fastpop's own modules, and
with Ctrl-C held back until the worker has set itself to ignore it."""

from __future__ import annotations

import contextlib
import signal
import sys
import types
from multiprocessing import resource_tracker


@contextlib.contextmanager
def starting_worker():
    """Processes started inside start from fastpop's own modules, not the parent's `__main__`,
    with SIGINT blocked.

    Spawning runs the parent's main script again in every child (as `__mp_main__`) unless it was
    started with `-m pkg` or has no file: for the `fastpop` console script that is the whole
    command line, JAX included (~1 s of CPU per collector, 16 of them on 2 cores). Nothing a
    worker is sent refers to `__main__`.

    Workers ignore SIGINT (the learner coordinates every stop), but only once their module runs:
    a Ctrl-C to the process group while one still imports printed its KeyboardInterrupt. The
    child inherits the blocked mask; the parent's own SIGINT is delivered when the block ends
    (blocked, not ignored: none is lost)."""
    # Started first: multiprocessing unblocks SIGINT and SIGTERM after starting it.
    resource_tracker.ensure_running()
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no __file__, no __spec__
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        sys.modules["__main__"] = main

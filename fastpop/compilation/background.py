"""Compiling in the background: one way for every program fastpop compiles ahead of its first
call (device mode's chunk program, env lanes and evaluation; process mode's update and replay
insert) while the run does something else.

The thread is an ordinary one, joined when the interpreter exits: a process exiting while XLA
compiles in a daemon thread aborts ("terminate called ... FATAL: exception not rethrown", seen
when a run was stopped in its warm-up while its update compiled).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor


def in_background(function, *args) -> Future:
    """`function(*args)` in a thread of its own, which ends with it. Its error, if any, is kept
    in the future: `result()` raises it, `exception()` only waits."""
    worker = ThreadPoolExecutor(1, thread_name_prefix="fastpop-compile")
    future = worker.submit(function, *args)
    worker.shutdown(wait=False)
    return future

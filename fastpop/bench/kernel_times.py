"""Where a compiled call's device time goes, kernel by kernel, read from JAX's profiler.

`anatomy.py` counts the kernels of a program from its HLO and divides the measured step by
their number; this measures them. A few calls are traced with `jax.profiler.trace`, the trace
is read back in the same process (`jax.profiler.ProfileData`), and the device's kernel events
(a GPU's streams; on a CPU the XLA client's thunks) are summed by name. Their busy time (the
union of their intervals) against the call's wall time tells a step bound by its kernels' work
from one bound by the gaps between them (launches, host syncs): the first wants fewer or
cheaper kernels, the second fewer launches (command buffers, CUDA graphs) or no syncs.
"""

from __future__ import annotations

import glob
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable

import jax

from fastpop.bench.common import running_update

# Events of a CPU trace that are not one kernel's work: the thread pool's markers, and the
# thunk executor's spans, which hold a whole program's thunks.
_NOT_KERNELS = ("ThreadpoolListener", "end: ", "ThunkExecutor")


def device_events(profile) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(name, start_ns, end_ns) of every kernel a trace holds: the events of an accelerator's
    stream lines, or where there is no accelerator plane, of the XLA CPU client's threads; and
    the "plane: line" names they were read from."""
    events, sources = [], []
    for plane in profile.planes:
        if plane.name.startswith("/device:"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    events += [(e.name, e.start_ns, e.end_ns) for e in line.events]
                    sources.append(f"{plane.name}: {line.name}")
    if events:
        return events, sources
    for plane in profile.planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                if "XLA" in line.name:
                    events += [
                        (e.name, e.start_ns, e.end_ns)
                        for e in line.events
                        if e.duration_ns > 0 and not e.name.startswith(_NOT_KERNELS)
                    ]
                    sources.append(f"{plane.name}: {line.name}")
    return events, sources


def busy_ns(events: list[tuple[str, int, int]]) -> int:
    """Nanoseconds some kernel was running: the union of the events' intervals."""
    total, end = 0, None
    for _, start, stop in sorted(events, key=lambda event: event[1]):
        if end is None or start >= end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def summarize(events: list[tuple[str, int, int]], calls: int, wall_seconds: float, top: int):
    """Per call: kernels, busy seconds against wall seconds, and the `top` kernels by time."""
    by_name = defaultdict(lambda: [0, 0])
    for name, start, stop in events:
        by_name[name][0] += 1
        by_name[name][1] += stop - start
    total_ns = sum(ns for _, ns in by_name.values()) or 1
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return {
        "calls_traced": calls,
        "kernels_per_call": len(events) / calls,
        "busy_seconds_per_call": busy_ns(events) / calls / 1e9,
        "wall_seconds_per_call": wall_seconds / calls,
        "top_kernels": [
            {
                "name": name,
                "per_call": count / calls,
                "seconds_per_call": ns / calls / 1e9,
                "share": ns / total_ns,
            }
            for name, (count, ns) in ranked
        ],
    }


def kernel_times(call: Callable[[], object], calls: int = 3, top: int = 8) -> dict:
    """Trace `calls` runs of `call` (compiled already; each blocks until its results are
    ready) and return `summarize`'s figures per call."""
    with tempfile.TemporaryDirectory(prefix="fastpop-trace-") as trace_dir:
        with jax.profiler.trace(trace_dir):
            start = time.perf_counter()
            for _ in range(calls):
                call()
            wall = time.perf_counter() - start
        paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
        if not paths:
            raise RuntimeError(f"jax.profiler.trace wrote no .xplane.pb under {trace_dir}")
        events, sources = device_events(jax.profiler.ProfileData.from_file(paths[0]))
        return summarize(events, calls, wall, top) | {"read_from": sources}


def executor_kernel_times(executor, states, replay, hparams, calls: int = 3) -> dict:
    """`kernel_times` of an executor's update call on copies of a row's trees (`running_update`),
    or why it could not be read: a benchmark keeps its timings whatever a profiler does on this
    machine."""
    update = running_update(executor, states, replay, hparams)

    def call():
        update(jax.random.key(0))

    try:
        call()  # compiled and warm before the trace
        return {"kernel_times": kernel_times(call, calls)}
    except Exception as error:  # recorded in the row; the sweep goes on
        return {"kernel_times_error": f"{type(error).__name__}: {error}"}


def kernel_line(algo: str, row: dict, steps: int) -> str:
    """A row's kernel times per update step (`steps` per call), as the console shows them."""
    times = row["kernel_times"]
    busy, wall = times["busy_seconds_per_call"] / steps, times["wall_seconds_per_call"] / steps
    top = ", ".join(
        f"{kernel['name'][:40]} {kernel['share']:.0%}" for kernel in times["top_kernels"][:3]
    )
    return (
        f"{algo} {row['impl']} P={row['population']}: kernels busy {1e6 * busy:.0f} us of a "
        f"{1e6 * wall:.0f} us step ({busy / wall:.0%}), "
        f"{times['kernels_per_call'] / steps:.0f} traced per step; most time: {top}"
    )

"""`fastpop bench update --kernel-times`: a call's kernels read back from JAX's profiler
(fastpop/bench/kernel_times.py): their busy time as the union of their intervals, and each
kernel's share of it, per call."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fastpop.bench import kernel_times


def test_busy_time_is_the_union_of_the_kernels_intervals():
    events = [("a", 0, 10), ("b", 5, 15), ("c", 20, 30), ("d", 22, 25)]
    assert kernel_times.busy_ns(events) == 15 + 10
    assert kernel_times.busy_ns([]) == 0


def test_kernels_are_summed_by_name_per_call_and_ranked_by_time():
    events = [("dot", 0, 30), ("add", 30, 40), ("dot", 50, 80), ("add", 80, 90)]
    summary = kernel_times.summarize(events, calls=2, wall_seconds=200e-9, top=1)
    assert summary["kernels_per_call"] == 2
    assert summary["busy_seconds_per_call"] == 40e-9
    assert summary["wall_seconds_per_call"] == 100e-9
    assert summary["top_kernels"] == [
        {"name": "dot", "per_call": 1.0, "seconds_per_call": 30e-9, "share": 0.75}
    ]


def test_a_traced_call_shows_its_matmul():
    matrix = jnp.ones((512, 512))
    program = jax.jit(lambda m: jnp.tanh(m @ m) @ m)
    program(matrix).block_until_ready()
    times = kernel_times.kernel_times(lambda: program(matrix).block_until_ready(), calls=2)
    assert times["calls_traced"] == 2 and times["kernels_per_call"] >= 2
    assert 0 < times["busy_seconds_per_call"] <= times["wall_seconds_per_call"]
    assert any("dot" in kernel["name"] for kernel in times["top_kernels"])

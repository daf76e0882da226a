"""The floor of a population update step: one definition, used by the console, the JSON, the
GPU programme's README and its automatic verdict.

    floor = max(FLOPs at the peak matmul rate of the compute dtype,
                parameter-state bytes at the measured memory bandwidth)

both rates measured in the same process as the step. The parameter-state bytes are what one
member's update must read and write of its own state, whatever the kernels: every tree an
optimizer steps has its parameters, gradients and Adam moments each read and written once
(8 passes of the parameters' bytes, the moments' own bytes counted as they are); every target
tree is read once per step (the bootstrap's forward pass) and written when it is updated.
Delayed steps count as they run: TD3's actor and targets on 1 / policy_delay of the steps,
DQN's hard target copy on 1 / target_update_period.

XLA's "bytes accessed" at the same bandwidth and the achieved share of the matmul rate are
printed beside the floor, never judged: on a GPU whose L2 holds a member's working set XLA's
byte count is no floor (the H100's SAC step ran at 0.63x it).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.agents import Agent, registry
from fastpop.agents.base import UpdateAnatomy
from fastpop.bench.common import best_seconds
from fastpop.types import Transition

# Per optimised tree: parameters read + written, gradients written + read.
PARAM_PASSES = 4
MOMENT_PASSES = 2  # Adam's moments read + written (their bytes counted from the state)
TARGET_READS, TARGET_WRITES = 1, 1


def update_anatomy(agent: Agent, hparams) -> UpdateAnatomy:
    """What its algorithm's entry says of its update (`AlgorithmEntry.update_anatomy`)."""
    entry = registry.get(agent.name) if agent.name in registry.NAMES else None
    if entry is None or entry.update_anatomy is None:
        known = [other.name for other in registry.entries() if other.update_anatomy is not None]
        raise ValueError(
            f"no state-traffic floor for {agent.name!r}; known: {', '.join(known)} (an "
            "algorithm's entry says what its update reads and writes: update_anatomy)"
        )
    return entry.update_anatomy(agent, hparams)


def update_cost(agent: Agent, hparams, batch: Transition) -> np.ndarray:
    """[FLOPs, bytes accessed] of one member's update from XLA's cost analysis: of its parts
    apart where it branches (XLA counts a conditional as its larger branch), each weighted by
    the fraction of steps that run it (TD3's delayed actor step: 1 / policy_delay)."""

    def cost(fn, *args) -> np.ndarray:
        analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
        return np.array([analysis["flops"], analysis["bytes accessed"]], float)

    state = jax.jit(agent.init)(jax.random.key(0), hparams)  # one compile, not one per op
    key = jax.random.key(1)
    parts = update_anatomy(agent, hparams).parts or ((agent.update, 1.0),)
    return sum(weight * cost(part, state, batch, hparams, key) for part, weight in parts)


def matmul_gflops(
    size: int | None = None, repeats: int = 5, precision: str | None = None, dtype=jnp.float32
) -> float:
    """Best-of-N GFLOP/s of one large square matmul of `dtype` on the default device, at JAX's
    default precision (TF32 for float32 on NVIDIA GPUs that have it) or at `precision`
    ("highest": full float32)."""
    size = size or (2048 if jax.devices()[0].platform == "cpu" else 8192)
    a = jax.random.normal(jax.random.key(0), (size, size), dtype)
    matmul = jax.jit(partial(jnp.matmul, precision=precision))
    seconds = best_seconds(lambda: matmul(a, a).block_until_ready(), repeats)
    return 2 * size**3 / seconds / 1e9


def tree_bytes(tree) -> float:
    return float(sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)))


def state_bytes_per_update(agent: Agent, hparams) -> float:
    """The parameter-state bytes one member's update step reads and writes (module docstring),
    from the agent's shapes (`jax.eval_shape`: nothing is computed) and what its entry says
    its update steps and writes (`update_anatomy`)."""
    anatomy = update_anatomy(agent, hparams)
    state = jax.eval_shape(agent.init, jax.random.key(0), hparams)
    fraction = anatomy.write_fractions
    total = 0.0
    for tree, moments in anatomy.optimised:
        passes = PARAM_PASSES * tree_bytes(getattr(state, tree))
        passes += MOMENT_PASSES * tree_bytes(getattr(state, moments))
        total += fraction.get(tree, 1.0) * passes
    for tree in anatomy.targets:
        size = tree_bytes(getattr(state, tree))
        total += TARGET_READS * size + fraction.get(tree, 1.0) * TARGET_WRITES * size
    return total


def floor_seconds(row: dict, rates: dict) -> dict:
    """A row's floor and the two terms it is the larger of, for its population, plus what is
    printed beside it (not judged). `rates`: "matmul_gflops_per_s" (the default precision's,
    TF32 on GPUs that have it), optionally "matmul_gflops_per_s_bfloat16", and "memory_gbps"."""
    size = row["population"]
    dtype = row.get("compute_dtype", "float32")
    peak = rates.get(f"matmul_gflops_per_s_{dtype}", rates["matmul_gflops_per_s"]) * 1e9
    bandwidth = rates["memory_gbps"] * 1e9
    compute = size * row["flops_per_update"] / peak
    state = size * row["state_bytes_per_update"] / bandwidth
    return {
        "compute_floor_seconds": compute,
        "state_floor_seconds": state,
        "floor_seconds": max(compute, state),
        "floor_bound": "matmul" if compute >= state else "state traffic",
        "matmul_peak_gflops_per_s": peak / 1e9,
        # beside the floor, not judged
        "xla_bytes_seconds": size * row["bytes_per_update"] / bandwidth,
    }


def add_floors(rows: list[dict], rates: dict, steps: int) -> None:
    """Each anatomised row's seconds per population step (`steps` update steps per timed call)
    against its floor: `times_floor` = step / floor, the one figure the targets judge."""
    for row in rows:
        if "kernels_per_update_step" not in row or "state_bytes_per_update" not in row:
            continue
        step = row["seconds_per_update_step"] = row["seconds_per_call"] / steps
        row |= floor_seconds(row, rates)
        row["times_floor"] = step / row["floor_seconds"]
        row["matmul_rate_fraction"] = row["compute_floor_seconds"] / step


def floor_line(algo: str, row: dict) -> str:
    """A vectorized row's step against its floor, as the console shows it."""
    us = {k: 1e6 * row[k] for k in ("seconds_per_update_step", "floor_seconds")}
    return (
        f"{algo} {row['impl']} P={row['population']}: step {us['seconds_per_update_step']:.0f} us"
        f" = {row['times_floor']:.2f}x its floor of {us['floor_seconds']:.0f} us ("
        f"{row['floor_bound']}; FLOPs {1e6 * row['compute_floor_seconds']:.0f} us at "
        f"{row['matmul_peak_gflops_per_s']:,.0f} GFLOP/s, state "
        f"{1e6 * row['state_floor_seconds']:.0f} us); beside it, not judged: XLA's bytes "
        f"{1e6 * row['xla_bytes_seconds']:.0f} us, matmul rate {row['matmul_rate_fraction']:.0%}"
        f"; {row['kernels_per_update_step']:.0f} kernels"
    )

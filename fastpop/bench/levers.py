"""The implementations `fastpop bench update` times, and the levers of the vectorized update.

An implementation is a JAX executor (`vectorized`, `sequential`, `sequential-in-one-program`),
a PyTorch baseline (`torch`, `torch-compile`, `torch-func`: `torch_variants.py`;
`torch-leanrl`, `torch-leanrl-fp32`: `torch_leanrl.py`), or the
vectorized update with levers turned on: `vectorized+LEVER[+LEVER...]`. A lever changes how
the update is computed, never what: the agent's config fields or the update plan's (each is
tested for equivalence in tests/test_update_levers.py).
"""

from __future__ import annotations

from typing import NamedTuple

from fastpop.agents import sac, td3

JAX_IMPLEMENTATIONS = ("vectorized", "sequential", "sequential-in-one-program")
# PyTorch at its strongest, as LeanRL writes it (torch_leanrl.py): the population's whole step
# compiled, K steps in one CUDA graph; TF32 matmuls as JAX's default, or off (-fp32).
LEANRL_IMPLEMENTATIONS = ("torch-leanrl", "torch-leanrl-fp32")
LEANRL_ALGOS = (td3.NAME, sac.NAME)  # the algorithms torch_compiled.py writes as LeanRL does
TORCH_IMPLEMENTATIONS = ("torch", "torch-compile", "torch-func", *LEANRL_IMPLEMENTATIONS)
IMPLEMENTATIONS = (*JAX_IMPLEMENTATIONS, *TORCH_IMPLEMENTATIONS)
SEQUENTIAL = ("sequential", "sequential-in-one-program")
# torch-compile compiles each member's step on its own (~1.6 s each on an H100, ~40 s on this
# CPU, and it needs a C++ compiler there), the LeanRL rows their step at every population size
# (~5-35 s each on this CPU): asked for by name only.
BY_NAME_ONLY = ("torch-compile", *LEANRL_IMPLEMENTATIONS)
DEFAULT_IMPLEMENTATIONS = tuple(name for name in IMPLEMENTATIONS if name not in BY_NAME_ONLY)


class Lever(NamedTuple):
    """What a lever sets: fields of the agent's config and of `population.UpdatePlan`."""

    agent: dict
    plan: dict
    why: str


LEVERS = {
    "draws-per-step": Lever(
        {}, {"draws_once": False}, "each step draws its random numbers (as the update once did)"
    ),
    "unroll-2": Lever({}, {"unroll": 2}, "the scan over K unrolled 2 steps per iteration"),
    "unroll-5": Lever({}, {"unroll": 5}, "the scan over K unrolled 5 steps per iteration"),
    "bf16": Lever({"compute_dtype": "bfloat16"}, {}, "bfloat16 matmuls, float32 parameters"),
    "pallas-mlp": Lever(
        {"mlp_kernel": "pallas"},
        {},
        "each MLP's forward in one fused Pallas kernel, its backward in another",
    ),
    "pallas-mlp-rows64": Lever(
        {"mlp_kernel": "pallas", "mlp_kernel_tiles": (64, 64, 8)},
        {},
        "the same, 64 rows per program: half the weight-gradient tiles, more registers",
    ),
}


# Agent config fields that change which kernels compute the update, not what it computes: its
# FLOPs and bytes are counted with them at their defaults (update.make_setups).
SAME_COST_FIELDS = ("mlp_kernel", "mlp_kernel_tiles")


class Implementation(NamedTuple):
    """A parsed implementation name."""

    name: str  # as given
    base: str  # one of IMPLEMENTATIONS
    agent: dict  # config fields the levers set
    plan: dict  # UpdatePlan fields the levers set


def parse(name: str) -> Implementation:
    """`name` -> its base implementation and levers; ValueError naming what is allowed."""
    base, *levers = name.split("+")
    if base not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown implementation {base!r}; choose from {', '.join(IMPLEMENTATIONS)}, or "
            f"vectorized+LEVER with levers {', '.join(LEVERS)}"
        )
    if levers and base != "vectorized":
        raise ValueError(f"levers apply to the vectorized update only, not to {base!r}")
    agent, plan = {}, {}
    for lever in levers:
        if lever not in LEVERS:
            choices = ", ".join(LEVERS)
            raise ValueError(f"unknown lever {lever!r} in {name!r}; choose from {choices}")
        agent |= LEVERS[lever].agent
        plan |= LEVERS[lever].plan
    return Implementation(name, base, agent, plan)


def add_speedups(rows: list[dict]) -> None:
    """Each row's agent-updates/s against the same population's sequential row, the best
    sequential JAX row and the best PyTorch row (the headline ratios), and in CPU seconds per
    call against sequential (less sensitive to other load on a shared machine)."""

    def best(impls) -> dict[int, float]:
        rates: dict[int, float] = {}
        for row in rows:
            if row["impl"] in impls:
                size = row["population"]
                rates[size] = max(rates.get(size, 0.0), row["agent_updates_per_s"])
        return rates

    baselines = {
        "speedup_over_sequential": best(("sequential",)),
        "speedup_over_best_sequential": best(SEQUENTIAL),
        "speedup_over_best_torch": best(TORCH_IMPLEMENTATIONS),
    }
    cpu = {
        r["population"]: r.get("cpu_seconds_per_call") for r in rows if r["impl"] == "sequential"
    }
    for row in rows:
        for field, rates in baselines.items():
            baseline = rates.get(row["population"])
            row[field] = row["agent_updates_per_s"] / baseline if baseline else None
        if row.get("cpu_seconds_per_call") and cpu.get(row["population"]):
            row["cpu_speedup_over_sequential"] = (
                cpu[row["population"]] / row["cpu_seconds_per_call"]
            )


def check_torch_rows(algo: str, implementations) -> None:
    """ValueError, before anything is timed, for LeanRL rows of an algorithm they lack."""
    asked = [name for name in implementations if name in LEANRL_IMPLEMENTATIONS]
    if asked and algo not in LEANRL_ALGOS:
        raise ValueError(
            f"{', '.join(asked)}: TD3 and SAC only ({', '.join(LEANRL_ALGOS)}), not {algo!r}; "
            f"for {algo} choose from torch, torch-compile, torch-func"
        )


def torch_benchmark(log):
    """`torch_variants.torch_update_benchmark`, or None (logged) without PyTorch."""
    try:
        from fastpop.bench.torch_variants import torch_update_benchmark
    except ImportError:
        log("torch: skipped (PyTorch is not installed; pip install 'fastpop[torch]')")
        return None
    return torch_update_benchmark


# `fastpop bench update`'s PyTorch rows -> torch_baseline's variants.
TORCH_VARIANTS = {"torch": "eager", "torch-compile": "compile", "torch-func": "func"}


def torch_row(torch_bench, algo: str, impl: str, size: int, flops: float, log) -> dict:
    """A PyTorch baseline's row at population `size`."""
    variant = TORCH_VARIANTS[impl]
    # Warm-up population steps: every agent's first update allocates; a compiled one also
    # compiles and records its CUDA graphs there.
    warmup = 1 if variant == "eager" else 3
    steps = max(3, 40 // size) if variant != "func" else 20
    result = torch_bench(algo, size, num_steps=steps, warmup_steps=warmup, variant=variant)
    rate = result["agent_updates_per_s"]
    log(
        f"{algo} {impl:10s} P={size:3d}  {rate:9.1f} agent-updates/s  "
        f"{rate * flops / 1e9:7.1f} GFLOP/s"
    )
    return {
        "impl": impl,
        "population": size,
        "agent_updates_per_s": rate,
        "seconds_per_call": result["seconds_per_step"],
        "compile_seconds": result.get("compile_seconds", 0.0),
        "gflops_per_s": rate * flops / 1e9,
        "torch_version": result["torch_version"],
        "torch_device": result["device"],
    }


def torch_rows(torch_bench, settings, impls: list[str], size: int, flops, log, rounds) -> list:
    """The PyTorch rows of `impls` at population `size`, in their order: torch_variants'
    baselines one after another, the LeanRL rows timed together in `rounds` alternating rounds
    (torch_leanrl.py)."""
    leanrl = [impl for impl in dict.fromkeys(impls) if impl in LEANRL_IMPLEMENTATIONS]
    timed = {}
    if leanrl:
        from fastpop.bench.torch_leanrl import leanrl_rows

        rows = leanrl_rows(settings, leanrl, size, flops, log, rounds=rounds)
        timed = {row["impl"]: row for row in rows}
    return [
        timed[impl]
        if impl in timed
        else torch_row(torch_bench, settings.algo, impl, size, flops, log)
        for impl in impls
    ]

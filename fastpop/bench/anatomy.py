"""What bounds a population update, read from XLA's own dumps.

For each vectorized row of `fastpop bench update`: the kernels the optimised whole-population
program launches per update step (parsed from its HLO: fusions, library calls and every other
op that is not a view or control flow; loops counted by their known trip counts, a conditional
by its larger branch; kernels XLA outlines into a command buffer, a CUDA graph launched at
once, are counted inside its `call`) and the measured seconds per kernel; with XLA's FLOPs and
bytes of one member's update, the floors a population step cannot go below: its FLOPs at the
matmul rate and its bytes at the memory bandwidth, both measured in the same run. A
conditional that runs on a known fraction of steps (TD3's delayed actor step: 1/policy_delay)
is counted as it runs: that fraction of its larger branch, the rest of its smaller. The
step's floor is bench/floors.py's.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp

from fastpop import population
from fastpop.bench.common import best_seconds

# Ops that launch nothing: views, tuples, control flow (its bodies are counted), async halves.
NOT_KERNELS = {
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "opt-barrier",
    "partition-id",
    "replica-id",
    "add-dependency",
    "domain",
}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = .*?\s([a-z][a-z0-9\-]*)\((.*)$")
_CALLED = {
    "while": re.compile(r"(?:condition|body)=%?([\w.\-]+)"),
    "call": re.compile(r"to_apply=%?([\w.\-]+)"),
}
_BRANCHES = re.compile(
    r"(?:branch_computations=\{([^}]*)\}|(?:true|false)_computation=%?([\w.\-]+))"
)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def parse_hlo(text: str) -> tuple[dict[str, list[tuple[str, str]]], str]:
    """Computations of an HLO module's text: name -> [(op, rest of its line)], and the entry's
    name."""
    computations, entry, current = {}, None, None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header and line.rstrip().endswith("{"):
            current = computations.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
            continue
        instruction = _INSTRUCTION.match(line) if current is not None else None
        if instruction:
            current.append((instruction.group(1), instruction.group(2)))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def kernels_per_call(text: str, taken: float | None = None) -> float:
    """Kernel launches of one call of the compiled program whose HLO `text` is. A conditional
    counts as its larger branch, or with `taken` (the fraction of its runs that take the larger
    branch) as that mix of its larger and smaller branch."""
    computations, entry = parse_hlo(text)

    @functools.cache
    def launches(name: str) -> int:
        total = 0
        for op, rest in computations.get(name, []):
            if op == "conditional":
                names = [n for group in _BRANCHES.findall(rest) for n in group if n]
                branches = [b.strip().lstrip("%") for n in names for b in n.split(",")]
                counts = [launches(b) for b in branches if b] or [0]
                if taken is None:
                    total += max(counts)
                else:
                    total += taken * max(counts) + (1 - taken) * min(counts)
            elif op in _CALLED:
                trip = _TRIP_COUNT.search(rest)
                called = sum(launches(n) for n in _CALLED[op].findall(rest))
                total += called * (int(trip.group(1)) if trip and op == "while" else 1)
            elif op not in NOT_KERNELS and not op.endswith("-done"):
                total += 1
        return total

    return launches(entry)


def update_anatomy(
    plan: population.UpdatePlan, update, states, replay, hparams, seconds_per_call, taken=None
):
    """Kernels per update step of `plan`'s whole-population program at this population size,
    and the measured seconds per kernel (`seconds_per_call`: one call of `plan.num_updates`
    steps). `update`: the executor's, whose compiled program is read where it is one (an
    accelerator's: no second compile); a CPU's runs chunks, so the whole-population program
    (`population.vectorized`'s) is compiled here. `taken`: see `kernels_per_call`."""
    program = update if hasattr(update, "lower") else population.vectorized(plan).update
    compiled = program.lower(states, replay, hparams, jax.random.key(0)).compile()
    kernels = kernels_per_call(compiled.as_text(), taken)
    return {
        "kernels_per_update_step": kernels / plan.num_updates,
        "seconds_per_kernel": seconds_per_call / kernels if kernels else None,
    }


def read_safely(plan, update, states, replay, hparams, seconds_per_call, taken=None) -> dict:
    """`update_anatomy`, or why it could not be read: a benchmark's timings are kept whatever
    an HLO text this parser has not met looks like."""
    try:
        return update_anatomy(plan, update, states, replay, hparams, seconds_per_call, taken)
    except Exception as error:  # recorded in the row; the sweep goes on
        return {"anatomy_error": f"{type(error).__name__}: {error}"}


def memory_gbps(megabytes: float | None = None, repeats: int = 5) -> float:
    """Best-of-N GB/s of one elementwise pass over a large float32 array (read and written)."""
    megabytes = megabytes or (256 if jax.devices()[0].platform == "cpu" else 2048)
    array = jnp.ones(int(megabytes * 2**20) // 4, jnp.float32)
    scale = jax.jit(lambda x: x * 1.0001)
    seconds = best_seconds(lambda: scale(array).block_until_ready(), repeats)
    return 2 * array.nbytes / seconds / 1e9

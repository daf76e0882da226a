"""Vectorized executor before and after members per chunk were measured per CPU, in one process.

Times three executors of the same update in alternating single calls (so load on a shared
machine hits all of them): `sequential`, the vectorized executor as `make_executor` builds it
now, and the vectorized executor of an earlier commit (default: chunks of 8 members inside one
program via lax.map), loaded from git. Prints median wall-clock and process CPU seconds per
call and their ratios to sequential.

    python results/bench/chunks_before_after.py --algo td3 --pop 16 --rounds 10
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax
import numpy as np

from fastpop import population
from fastpop.agents import make_agent
from fastpop.bench.random_replay import BENCH_SPECS, random_replay
from fastpop.population import replay

BEFORE = "9575047"  # the last commit with chunks of 8 inside one program


def executor_from_commit(commit: str):
    """fastpop/population.py as it was at `commit`, imported as a module of its own."""
    source = subprocess.run(
        ["git", "show", f"{commit}:fastpop/population.py"],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"population_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default="td3")
    parser.add_argument("--pop", type=int, default=16)
    parser.add_argument("--updates-per-call", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--before", default=BEFORE, help="commit of the earlier executor")
    args = parser.parse_args()
    size, updates = args.pop, args.updates_per_call
    agent = make_agent(args.algo, BENCH_SPECS[args.algo])
    spec, buffers = random_replay(args.algo, size, jax.random.key(0))
    sample = partial(replay.sample, spec, batch_size=agent.batch_size)
    hparams = population.broadcast_hparams(agent.default_hparams(), size)
    states = population.init_population(agent, jax.random.key(1), hparams)
    unroll = population.scan_unroll(BENCH_SPECS[args.algo].obs_shape, updates)
    before = executor_from_commit(args.before)
    executors = {
        "sequential": population.sequential(agent, sample, updates, unroll=unroll),
        "before": before.make_executor("vectorized", agent, sample, updates, unroll=unroll),
        "now": population.make_executor("vectorized", agent, sample, updates, unroll=unroll),
    }
    runs, wall, cpu = {}, {name: [] for name in executors}, {name: [] for name in executors}
    for name, executor in executors.items():  # compile (and, now, measure the chunk size)
        run = [executor.adopt(t) for t in (population.copy_tree(states), buffers, hparams)]
        run[0], _ = executor.update(*run, jax.random.key(0))
        runs[name] = jax.block_until_ready(run)
    for round_index in range(args.rounds):
        for name, executor in executors.items():
            run = runs[name]
            start, cpu_start = time.perf_counter(), time.process_time()
            run[0], _ = executor.update(*run, jax.random.key(round_index + 1))
            jax.block_until_ready(run[0])
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - cpu_start)
    chosen = getattr(executors["now"].update, "chosen", {}).get(size)
    print(f"{args.algo} P={size} K={updates}; now: {chosen} members per chunk", file=sys.stderr)
    for name in executors:
        wall_ratio = np.median(wall["sequential"]) / np.median(wall[name])
        cpu_ratio = np.median(cpu["sequential"]) / np.median(cpu[name])
        print(
            f"{name:10s} {np.median(wall[name]):.3f} s/call ({wall_ratio:.2f}x sequential), "
            f"CPU {np.median(cpu[name]):.3f} s/call ({cpu_ratio:.2f}x)"
        )


if __name__ == "__main__":
    main()

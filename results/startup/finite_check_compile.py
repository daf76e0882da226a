"""Seconds XLA takes to compile the members' finiteness check (run once per evaluation round),
as fastpop writes it (leaves concatenated in groups: one reduction per group) against one
reduction per leaf (as it was written before), for a population of 2 of each preset, with
XLA's optimizations (a user's run) and with most of them off (the test suite's default).

    python results/startup/finite_check_compile.py [PRESET ...]

Each figure is the median of 3 compiles, each in a fresh process (JAX keeps a compiled module in
memory, so a second compile of it in one process costs nothing) after a warm-up compile of
another program, with the persistent compilation cache off; the two formulas alternate.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = ["td3_pendulum_cpu", "sac_pendulum_cpu", "dqn_pbt_pong_cpu"]
FORMULAS = ("per_leaf", "grouped")
REPEATS = 3


def one(preset: str, formula: str) -> None:
    """In a fresh process: print the leaves and the seconds of one compile of `formula`."""
    import jax
    import jax.numpy as jnp

    from fastpop import config as config_lib
    from fastpop.population import stacking
    from fastpop.run.parts import build_learner

    def per_leaf(population):
        checks = [
            jnp.all(jnp.isfinite(leaf.reshape(leaf.shape[0], -1)), axis=1)
            for leaf in jax.tree.leaves(population)
            if jnp.issubdtype(leaf.dtype, jnp.inexact)
        ]
        return jnp.all(jnp.stack(checks), axis=0)

    function = per_leaf if formula == "per_leaf" else stacking.finite_members.__wrapped__
    config = config_lib.load_config(CONFIGS / f"{preset}.yaml", ["population.size=2"])
    learner = build_learner(config)
    jax.config.update("jax_enable_compilation_cache", False)  # after the build turned it on
    members = learner.training.members(learner.states)
    jax.jit(lambda x: x + 1).lower(jnp.ones(3)).compile()  # warm-up
    lowered = jax.jit(function).lower(members)
    start = time.perf_counter()
    lowered.compile()
    print(len(jax.tree.leaves(members)), time.perf_counter() - start)


def main(presets: list[str]) -> None:
    print("| preset | leaves | XLA's optimizations | per leaf (s) | grouped (s) |")
    print("|---|---:|---|---:|---:|")
    for preset in presets:
        for disabled in ("0", "1"):
            env = os.environ | {"JAX_DISABLE_MOST_OPTIMIZATIONS": disabled}
            seconds = {formula: [] for formula in FORMULAS}
            for _ in range(REPEATS):
                for formula in FORMULAS:
                    command = [sys.executable, __file__, "--one", preset, formula]
                    done = subprocess.run(command, env=env, capture_output=True, text=True)
                    done.check_returncode()
                    leaves, took = done.stdout.split()[-2:]
                    seconds[formula].append(float(took))
            label = "most off" if disabled == "1" else "on"
            row = " | ".join(f"{statistics.median(seconds[f]):.3f}" for f in FORMULAS)
            print(f"| {preset} | {leaves} | {label} | {row} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        one(*sys.argv[2:4])
    else:
        main(sys.argv[1:] or PRESETS)

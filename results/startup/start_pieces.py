"""Two pieces of the brax preset's start, each timed in fresh processes, before and after stop 37:

- `trace`: seconds to trace and lower its chunk's two programs (`DeviceCollection.make_ahead`'s
  first half), with CPython's default garbage collector and with fastpop's
  (`fastpop/gc_settings.py`);
- `brax`: seconds to build the brax environment, with brax's own loader (a compiled `jnp.array`
  copy per leaf of the system) and with fastpop's (`brax_envs._make`), compilation cache off
  ("cold") and over a cache the previous run filled ("warm");
- `learner`: seconds to make a preset's learner (`--preset`, default td3_cemrl_hopper_cpu:
  CEM-RL's initial actors and the shared critic), and the programs it compiled or loaded, over
  one fresh cache: once cold, then warm. The code measured is whatever `fastpop` PYTHONPATH
  gives, so an older commit unpacked with `git archive` is measured the same way.

    python results/startup/start_pieces.py --repeats 3
    PYTHONPATH=/tmp/fastpop-before python results/startup/start_pieces.py --pieces learner

Prints a markdown table of each variant's seconds, one figure per fresh process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "td3_brax_inverted_pendulum_cpu.yaml"

TRACE = """
import gc, sys, time
if sys.argv[1] == "fastpop":
    from fastpop.gc_settings import tune_for_tracing
    tune_for_tracing()
else:
    gc.set_threshold(700, 10, 10)  # CPython's default
from fastpop import config as config_lib
from fastpop.collect import chunk_programs
from fastpop.learn.learner import chunk_program_inputs
from fastpop.collect.device_collection import DeviceCollection
from fastpop.run import parts as run_parts

parts = run_parts.build_run(config_lib.load_config(sys.argv[2]))
device = DeviceCollection(parts.device)
start = time.perf_counter()
add_rows, state = chunk_program_inputs(parts.learner)
programs = chunk_programs.chunk_programs(parts.learner.training, add_rows, device.chunk_rollout)
lanes = device.env_lanes.shapes()
for _ in chunk_programs.lowerings(programs, lanes, state):
    pass
print(time.perf_counter() - start)
"""

BRAX = """
import sys, time, warnings
from fastpop.gc_settings import tune_for_tracing
tune_for_tracing()
import jax
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
from fastpop.envs import brax_envs, mjx_import
mjx_import.import_mjx()
import brax.envs
warnings.simplefilter("ignore")
start = time.perf_counter()
if sys.argv[1] == "brax":
    brax.envs.get_environment("inverted_pendulum", backend="generalized")
else:
    brax_envs._make.__wrapped__("brax/inverted_pendulum", "generalized")
print(time.perf_counter() - start)
"""

LEARNER = """
import sys, time
from fastpop.gc_settings import tune_for_tracing
tune_for_tracing()
import jax
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
from fastpop import config as config_lib
from fastpop.compilation import compile_stats
from fastpop.learn.learner import Learner
from fastpop.run import parts as run_parts

compile_stats.install()
parts = run_parts.build_run(config_lib.load_config(sys.argv[1]))
start = time.perf_counter()
Learner(parts.learner)
print(compile_stats.counts()["programs"], time.perf_counter() - start)
"""


def seconds(script: str, args: list[str], env: dict) -> float:
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, check=True
    )
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pieces", nargs="+", default=["trace", "brax"])
    parser.add_argument("--preset", default="td3_cemrl_hopper_cpu", help="the learner piece's")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    base |= {"FASTPOP_COMPILE_CACHE": "0"}
    rows = {}
    if "learner" in args.pieces:
        with tempfile.TemporaryDirectory() as cache:
            env = base | {"JAX_COMPILATION_CACHE_DIR": cache}
            for run in ["cold", *["warm"] * args.repeats]:
                result = subprocess.run(
                    [sys.executable, "-c", LEARNER, str(CONFIG.parent / f"{args.preset}.yaml")],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                )
                programs, value = result.stdout.split()[-2:]
                key = f"make {args.preset}'s learner, {run} cache ({programs} programs)"
                rows.setdefault(key, []).append(float(value))
    for _ in range(args.repeats):
        for collector in ("default", "fastpop") if "trace" in args.pieces else ():
            key = f"trace the chunk program, {collector} garbage collector"
            rows.setdefault(key, []).append(seconds(TRACE, [collector, str(CONFIG)], base))
        for loader in ("brax", "fastpop") if "brax" in args.pieces else ():
            with tempfile.TemporaryDirectory() as cache:
                env = base | {"JAX_COMPILATION_CACHE_DIR": cache}
                for run in ("cold", "warm"):
                    key = f"build the brax env, {loader}'s loader, {run} cache"
                    rows.setdefault(key, []).append(seconds(BRAX, [loader], env))
    print("| piece | seconds (one per fresh process) |\n| --- | --- |")
    for key, values in rows.items():
        print(f"| {key} | {', '.join(f'{v:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()

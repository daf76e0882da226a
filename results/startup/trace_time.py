"""Seconds to build a device-mode preset's run and to trace and lower its chunk's two programs:
what a cold start does on its main thread before and beside their XLA compiles. In this
process; nothing is compiled but a few small programs. Run each tree in fresh processes,
alternating, with PYTHONPATH naming the tree:

    FASTPOP_COMPILE_CACHE=0 FASTPOP_CACHE_DIR=$(mktemp -d) PYTHONPATH=TREE \\
        python results/startup/trace_time.py td3_brax_inverted_pendulum_cpu
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import fastpop
from fastpop import config as config_lib
from fastpop.collect import chunk_programs
from fastpop.collect.device_collection import DeviceCollection
from fastpop.commands import cli  # noqa: F401  (imported as `fastpop train` imports it)
from fastpop.learn.learner import chunk_program_inputs
from fastpop.run.parts import build_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a device-mode preset's name in configs/")
    preset = parser.parse_args().preset
    tree = Path(fastpop.__file__).resolve().parents[1]
    config = config_lib.load_config(tree / "configs" / f"{preset}.yaml", [])

    started = time.perf_counter()
    parts = build_run(config)
    built = time.perf_counter() - started

    learner_parts = parts.learner
    collection = DeviceCollection(parts.device)
    started = time.perf_counter()
    add_rows, state = chunk_program_inputs(learner_parts)
    programs = chunk_programs.chunk_programs(
        parts.learner.training, add_rows, collection.chunk_rollout
    )
    lanes = collection.env_lanes.shapes()
    for _ in chunk_programs.lowerings(programs, lanes, state):
        pass
    traced = time.perf_counter() - started
    print(f"{preset} build_run {built:.2f} s, trace + lower {traced:.2f} s ({tree})")


if __name__ == "__main__":
    main()

"""Seconds to trace and compile device mode's chunk as one program (the collect program and the
update program called inside one jit, as fastpop compiled a chunk until stop 44) or as the two
programs a run compiles now, each in a thread of its own as soon as it is traced (`two`; `two-xla`:
the same with the collect program at XLA's default options, not `xla_defaults.ENV_STEPPING`, as
before stop 45). Nothing is cached or stored; run each way in fresh processes, alternating:

    for way in one two one two; do
        FASTPOP_COMPILE_CACHE=0 FASTPOP_CACHE_DIR=$(mktemp -d) \\
            python results/startup/chunk_compile.py td3_brax_inverted_pendulum_cpu $way
    done
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax

import fastpop
from fastpop import config as config_lib
from fastpop.collect import chunk_programs
from fastpop.collect.device_collection import DeviceCollection
from fastpop.commands import cli  # noqa: F401  (imported as `fastpop train` imports it)
from fastpop.compilation.background import in_background
from fastpop.learn.learner import chunk_program_inputs
from fastpop.learn.learner_state import LearnerState
from fastpop.run.parts import build_run


def lower_as_one(programs: chunk_programs.ChunkPrograms, lanes, learner: LearnerState):
    """Both programs called inside one jit (env lanes, buffers and states donated, as the one
    program was), lowered for `chunk_programs.placed_arguments`, as `lowerings` lowers them."""

    def chunk(lanes, buffers, states, collect_key, plan, rest):
        key, hparams, member_hparams = rest
        lanes, buffers = programs.collect(lanes, buffers, states, collect_key, hparams, plan)
        return lanes, programs.update(buffers, states, key, member_hparams, plan)

    lanes, learner, collect_key, plan = chunk_programs.placed_arguments(lanes, learner)
    buffers, states, *rest = learner
    jitted = jax.jit(chunk, donate_argnums=(0, 1, 2))
    return jitted.lower(lanes, buffers, states, collect_key, plan, tuple(rest))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="a device-mode preset's name in configs/")
    parser.add_argument("way", choices=("one", "two", "two-xla"))
    args = parser.parse_args()
    tree = Path(fastpop.__file__).resolve().parents[1]
    config = config_lib.load_config(tree / "configs" / f"{args.preset}.yaml", [])
    parts = build_run(config)
    collection = DeviceCollection(parts.device)
    add_rows, state = chunk_program_inputs(parts.learner)
    programs = chunk_programs.chunk_programs(
        parts.learner.training, add_rows, collection.chunk_rollout
    )
    lanes = collection.env_lanes.shapes()

    started, cpu_started = time.perf_counter(), time.process_time()
    if args.way == "one":
        lowered = lower_as_one(programs, lanes, state)
        traced = time.perf_counter() - started
        lowered.compile()
    else:
        compiles = []
        for lowered in chunk_programs.lowerings(programs, lanes, state):
            options = None
            if args.way == "two-xla" and not compiles:  # the collect program
                options = {"xla_cpu_use_fusion_emitters": True}  # XLA's default
            compiles.append(in_background(lowered.compile, options))
        traced = time.perf_counter() - started
        for compiling in compiles:
            compiling.result()
    total = time.perf_counter() - started
    print(
        f"{args.preset} {args.way}: traced and lowered by {traced:.2f} s, compiled by "
        f"{total:.2f} s ({total - traced:.2f} s after the last trace), "
        f"{time.process_time() - cpu_started:.1f} CPU-s"
    )


if __name__ == "__main__":
    main()

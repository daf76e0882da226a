"""Milliseconds per call of device mode's collect program (rollout and replay insert) compiled
with XLA's default options and with `xla_defaults.ENV_STEPPING`, in one process, alternating
rounds of a few seconds each: whether the options that halve an env step's compile cost speed.

    python results/startup/collect_time.py --pop 16 --rounds 3
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax

from fastpop import config as config_lib
from fastpop import xla_defaults
from fastpop.collect import chunk_programs
from fastpop.collect.device_collection import DeviceCollection
from fastpop.compilation import stored_programs
from fastpop.learn.learner import Learner, chunk_program_inputs
from fastpop.learn.learner_state import ChunkPlan
from fastpop.run.parts import build_run

PRESET = Path(__file__).resolve().parents[2] / "configs" / "td3_brax_inverted_pendulum_cpu.yaml"
WAYS = {"XLA's defaults": {"xla_cpu_use_fusion_emitters": True}, "ENV_STEPPING": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pop", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    config = config_lib.load_config(PRESET, [f"population.size={args.pop}"])
    parts = build_run(config)
    collection = DeviceCollection(parts.device)
    add_rows, shapes = chunk_program_inputs(parts.learner)
    programs = chunk_programs.chunk_programs(
        parts.learner.training, add_rows, collection.chunk_rollout
    )
    lanes = collection.env_lanes.shapes()
    lowered = next(chunk_programs.lowerings(programs, lanes, shapes))
    compiled = {way: lowered.compile(options) for way, options in WAYS.items()}
    learner = Learner(parts.learner)
    plan = ChunkPlan.template(args.pop)
    print(f"P = {args.pop}, ENV_STEPPING = {xla_defaults.ENV_STEPPING}")
    for round_ in range(args.rounds):
        for way, program in compiled.items():
            lanes = collection.env_lanes.program(collection.env_lanes.key)
            lanes, state = stored_programs.committed((lanes, learner.state))
            buffers, calls, start = state.buffers, 0, time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                lanes, buffers = program(
                    lanes, buffers, state.states, jax.random.key(calls), state.hparams, plan
                )
                calls += 1
            jax.block_until_ready(buffers)
            seconds = (time.perf_counter() - start) / calls
            print(f"round {round_}: {way}: {seconds * 1e3:.2f} ms per call")
            learner.replay.buffers = buffers  # donated: the next round's start


if __name__ == "__main__":
    main()

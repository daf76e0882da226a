"""Seconds of a preset's update call as a run makes it (`fastpop.run.parts.build_learner`: its
executor, its updates per call), on replay buffers holding `replay.min_size` random rows per
member: the first call (compiling, or loading from the compilation cache) and the calls after.

    FASTPOP_COMPILE_CACHE=0 python results/startup/update_call.py --preset dqn_pbt_pong_cpu

Another checkout: PYTHONPATH=<its root> python results/startup/update_call.py ...
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.population import replay
from fastpop.run.parts import build_learner

ROOT = Path(__file__).resolve().parents[2]


def random_chunk(spec: replay.ReplaySpec, lanes: int, chunk_len: int, rng) -> replay.Rows:
    """Host rows of every lane, as a collector sends them: random values of the right kinds."""
    layout = replay.row_layout(spec, (lanes, chunk_len))

    def leaf(shape_dtype):
        if shape_dtype.dtype == np.uint8:
            return rng.integers(0, 256, shape_dtype.shape, np.uint8)
        if shape_dtype.dtype == bool:
            return np.zeros(shape_dtype.shape, bool)
        return rng.standard_normal(shape_dtype.shape).astype(shape_dtype.dtype)

    rows = replay.Rows(*(leaf(x) for x in layout))
    return rows._replace(action=np.zeros_like(rows.action))  # a valid action of any space


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="dqn_pbt_pong_cpu")
    parser.add_argument("--calls", type=int, default=4, help="timed calls after the first")
    args = parser.parse_args()
    config = config_lib.load_config(ROOT / "configs" / f"{args.preset}.yaml")
    learner = build_learner(config)
    lanes = config.population.size * config.collect.envs_per_member
    chunk_len, rng = config.collect.chunk_len, np.random.default_rng(0)
    chunk = random_chunk(learner.replay.spec, lanes, chunk_len, rng)
    per_lane = -(-config.replay.min_size // config.collect.envs_per_member)
    for _ in range(-(-per_lane // chunk_len)):  # the same random chunk: timing only
        learner.replay.insert(chunk)
    start = time.perf_counter()
    learner.update()
    jax.block_until_ready(learner.states)
    first = time.perf_counter() - start
    seconds = []
    for _ in range(args.calls):
        start = time.perf_counter()
        learner.update()
        jax.block_until_ready(learner.states)
        seconds.append(time.perf_counter() - start)
    updates = config.population.size * config.train.updates_per_call
    print(
        f"{args.preset}: {updates} member updates per call; first call {first:.1f} s, then "
        f"{min(seconds):.2f} s per call (best of {args.calls}: "
        f"{', '.join(f'{s:.2f}' for s in seconds)}) on {jax.devices()[0].device_kind}"
    )


if __name__ == "__main__":
    main()

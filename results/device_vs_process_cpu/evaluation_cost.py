"""What device mode's in-loop evaluations cost in the device arm of run.sh.

Device-mode calls are dispatched asynchronously, so the run's own timer for an evaluation also
holds the fused training calls queued before it. This waits for those first, then times each
evaluation alone. Run from the repository root, optionally with --set style overrides:

    python results/device_vs_process_cpu/evaluation_cost.py
    python results/device_vs_process_cpu/evaluation_cost.py eval.interval=12000
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import jax

from fastpop import config as config_lib
from fastpop.collect import device_collection
from fastpop.run import loop

PRESET = Path("configs/td3_brax_inverted_pendulum_cpu.yaml")


def main(overrides: list[str]) -> None:
    seconds: list[float] = []
    evaluate = device_collection.DeviceCollection.evaluate

    def timed(collection, arrays):
        jax.block_until_ready(collection.learner.states)  # training queued before: not ours
        start = time.perf_counter()
        evaluate(collection, arrays)
        seconds.append(time.perf_counter() - start)

    device_collection.DeviceCollection.evaluate = timed
    config = config_lib.load_config(
        PRESET, ["population.seeds=4", "log.tensorboard=false", *overrides]
    )
    with tempfile.TemporaryDirectory() as out:
        summary = loop.Run(config, Path(out), log=lambda message: None).run()
    print(f"wall time {summary['wall_time']:.1f} s; {len(seconds)} evaluations in the loop:")
    print("  " + ", ".join(f"{s:.2f} s" for s in seconds) + f" (sum {sum(seconds):.1f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Host seconds of one PB2 round at a population size: the GP's fit over `window` evaluations
of every member, then the replaced quarter's choices (GP-UCB with pending points). The loop
makes this round between two update calls, so a GPU waits for it.

    python results/pb2_cpu/round_time.py --sizes 16 80 256 --repeats 3
    PYTHONPATH=OTHER_TREE python results/pb2_cpu/round_time.py ...   # another version's
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fastpop.strategies import gp, pb2


def round_seconds(size: int, window: int, dims: int, seed: int) -> tuple[float, float, int]:
    """(fit s, choose s, observations fitted) on synthetic observations: `window` evaluations
    of `size` members."""
    rng = np.random.default_rng(seed)
    count = size * window
    x = rng.uniform(size=(count, dims))
    t = np.repeat(np.arange(window), size).astype(float)
    y = np.sin(3 * x[:, 0]) + 0.1 * rng.normal(size=count)
    start = time.perf_counter()
    observations = np.column_stack([t, y, x])
    if hasattr(pb2, "newest_within"):  # what a round fits (versions before it: everything)
        observations = pb2.newest_within(observations, pb2.MAX_GP_POINTS)
    t, y, x = observations[:, 0], observations[:, 1], observations[:, 2:]
    model = gp.fit(x, t, y)
    fitted = time.perf_counter()
    running = rng.uniform(size=(size - size // 4, dims))
    pb2.choose_configurations(model, window, running, size // 4, rng)
    return fitted - start, time.perf_counter() - fitted, len(observations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 80])
    parser.add_argument("--window", type=int, default=10, help="pb2.window (the default)")
    parser.add_argument("--dims", type=int, default=3, help="hparams with a prior")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for size in args.sizes:
        times = [round_seconds(size, args.window, args.dims, seed) for seed in range(args.repeats)]
        fits, chooses, fitted = zip(*times, strict=True)
        print(
            f"P={size} ({fitted[0]} of {size * args.window} observations fitted, "
            f"{size // 4} choices): "
            f"fit {min(fits):.2f}-{max(fits):.2f} s, choose {min(chooses):.2f}-{max(chooses):.2f} s"
        )


if __name__ == "__main__":
    main()

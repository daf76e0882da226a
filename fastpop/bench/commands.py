"""`fastpop bench update | pipeline | checkpoint`: the parsers and handlers.

The benchmarks themselves are imported only when one runs, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastpop.agents import ALGORITHMS
from fastpop.bench import checkpoint
from fastpop.cli_args import comma_list, fail, one_of, positive_int, positive_int_arg

IMPLEMENTATIONS = ("vectorized", "sequential", "torch")


def add_parser(commands) -> argparse.ArgumentParser:
    """Adds `bench` and its subcommands to the `fastpop` subcommands."""
    parser = commands.add_parser("bench", help="benchmarks")
    benchmarks = parser.add_subparsers(dest="bench", required=True)
    add_update_parser(benchmarks)
    add_pipeline_parser(benchmarks)
    checkpoint.add_parser(benchmarks)
    return parser


def add_update_parser(benchmarks) -> None:
    update = benchmarks.add_parser(
        "update",
        help="population-wide update step: vectorized vs sequential vs PyTorch",
        description="Agent-updates/s of one population-wide update step on random data of the "
        "paper's shapes (HalfCheetah for TD3/SAC, Atari for DQN). Writes "
        "results/bench/update_<algo>_<device>.json and .png.",
    )
    update.add_argument(
        "--algo",
        type=one_of("algorithm", ALGORITHMS),
        default="td3",
        help=f"one of {', '.join(ALGORITHMS)} (default td3)",
    )
    update.add_argument(
        "--pop",
        type=comma_list(positive_int, "population size"),
        default=[1, 2, 4, 8],
        help="population sizes, comma-separated (default 1,2,4,8)",
    )
    update.add_argument(
        "--impl",
        type=comma_list(str, "implementation", IMPLEMENTATIONS),
        default=list(IMPLEMENTATIONS),
        help=f"implementations, comma-separated from {','.join(IMPLEMENTATIONS)} (default all)",
    )
    update.add_argument(
        "--batch-size",
        type=positive_int_arg("batch size"),
        default=None,
        help="transitions per update (default: the paper's, 256 for TD3/SAC, 32 for DQN)",
    )
    update.add_argument(
        "--updates-per-call",
        type=positive_int_arg("updates per call"),
        default=10,
        help="K: updates per compiled call (the scan length)",
    )
    update.add_argument(
        "--min-seconds", type=float, default=2.0, help="timed seconds per measurement"
    )
    update.add_argument("--out", type=Path, default=Path("results/bench"))


def add_pipeline_parser(benchmarks) -> None:
    pipeline = benchmarks.add_parser(
        "pipeline",
        help="collection rate and learner utilisation of a real TD3 run",
        description="Collector env steps/s against gymnasium's raw rate, and a real TD3 run's "
        "agent-updates/s against the update benchmark at the same population. Writes "
        "results/bench/pipeline_<env>_<device>.json.",
    )
    pipeline.add_argument("--env", default="HalfCheetah-v5")
    pipeline.add_argument("--pop", type=positive_int_arg("population size"), default=4)
    pipeline.add_argument(
        "--collectors",
        type=comma_list(positive_int, "collector count"),
        default=[1, 2],
        help="collector counts to measure (default 1,2)",
    )
    pipeline.add_argument(
        "--seconds", type=float, default=10.0, help="timed seconds per collection measurement"
    )
    pipeline.add_argument(
        "--train-seconds", type=float, default=120.0, help="wall seconds of the training run"
    )
    pipeline.add_argument("--out", type=Path, default=Path("results/bench"))


def run(args: argparse.Namespace) -> int:
    """The `fastpop bench` handler: the exit code of the chosen benchmark."""
    handlers = {"update": run_update, "pipeline": run_pipeline, "checkpoint": checkpoint.run}
    return handlers[args.bench](args)


def run_update(args: argparse.Namespace) -> int:
    from fastpop.bench.update import bench_update, write_results

    result = bench_update(
        args.algo,
        args.pop,
        args.impl,
        updates_per_call=args.updates_per_call,
        batch_size=args.batch_size,
        min_seconds=args.min_seconds,
    )
    json_path, png_path = write_results(result, args.out)
    print(
        f"large matmul: {result['matmul_gflops_per_s']:.1f} GFLOP/s; "
        f"{result['flops_per_update'] / 1e6:.1f} MFLOP per agent update"
    )
    print(f"wrote {json_path} and {png_path}")
    return 0


def run_pipeline(args: argparse.Namespace) -> int:
    from fastpop.bench.pipeline import bench_pipeline, write_pipeline_results
    from fastpop.config import ConfigError

    try:
        result = bench_pipeline(
            args.env, args.pop, args.collectors, args.seconds, args.train_seconds
        )
    except (ConfigError, ValueError) as error:
        return fail(str(error))
    print(f"wrote {write_pipeline_results(result, args.out)}")
    return 0

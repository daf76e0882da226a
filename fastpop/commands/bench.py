"""`fastpop bench update | pipeline | checkpoint | device | gpu`: the parsers and handlers
(device's in bench_device.py, gpu's in bench_gpu.py).

The benchmarks themselves are imported only when one runs, so building the parser stays fast.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fastpop.agents import ALGORITHMS, registry
from fastpop.bench import checkpoint, levers
from fastpop.bench.checkpoint_timing import fill_replay, tree_bytes
from fastpop.bench.common import build_learner
from fastpop.commands.args import comma_list, fail, one_of, positive_int, positive_int_arg
from fastpop.commands.bench_device import add_device_parser, run_device
from fastpop.commands.bench_gpu import add_gpu_parser, run_gpu
from fastpop.population import chunking


def implementation_name(text: str) -> str:
    """An implementation of `fastpop bench update` (ValueError naming what is allowed)."""
    levers.parse(text)
    return text


def add_parser(commands) -> argparse.ArgumentParser:
    """Adds `bench` and its subcommands to the `fastpop` subcommands."""
    parser = commands.add_parser("bench", help="benchmarks")
    benchmarks = parser.add_subparsers(dest="bench", required=True)
    add_update_parser(benchmarks)
    add_pipeline_parser(benchmarks)
    add_checkpoint_parser(benchmarks)
    add_device_parser(benchmarks)
    add_gpu_parser(benchmarks)
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
        default=registry.DEFAULT,
        help=f"one of {', '.join(ALGORITHMS)} (default {registry.DEFAULT})",
    )
    update.add_argument(
        "--pop",
        type=comma_list(positive_int, "population size"),
        default=[1, 2, 4, 8],
        help="population sizes, comma-separated (default 1,2,4,8)",
    )
    update.add_argument(
        "--impl",
        type=comma_list(implementation_name, "implementation"),
        default=list(levers.DEFAULT_IMPLEMENTATIONS),
        help=f"implementations, comma-separated from {','.join(levers.IMPLEMENTATIONS)} "
        f"(default all but torch-compile, which compiles every member's step: minutes, and "
        f"torch-leanrl[-fp32], which compile their step at every size), or "
        f"vectorized+LEVER[+LEVER] with levers {','.join(levers.LEVERS)}",
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
        help="K: updates per member per call (Atari frames on a CPU: K one-update programs)",
    )
    update.add_argument(
        "--min-seconds", type=float, default=2.0, help="timed seconds per measurement"
    )
    update.add_argument(
        "--anatomy-from",
        type=positive_int_arg("population size"),
        default=1,
        help="from this population size on (default 1: every row), each vectorized row also "
        "gets what bounds it: the kernels per update step of XLA's program, and its FLOPs and "
        "bytes at the measured matmul rate and memory bandwidth (on a CPU one more compile "
        "per size)",
    )
    update.add_argument(
        "--kernel-times",
        action="store_true",
        help="those rows also trace a few calls with JAX's profiler: the device's busy time "
        "against the step's wall time, and the kernels that take most of it",
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
    chunking.measure_at_first_call()  # not inside a timed call (fastpop.population)
    handlers = {
        "update": run_update,
        "pipeline": run_pipeline,
        "checkpoint": run_checkpoint,
        "device": run_device,
        "gpu": run_gpu,
    }
    return handlers[args.bench](args)


def run_update(args: argparse.Namespace) -> int:
    from fastpop.bench.update import UpdateBenchSettings, bench_update
    from fastpop.bench.update_report import write_results

    try:
        levers.check_torch_rows(args.algo, args.impl)
    except ValueError as error:
        return fail(str(error))
    settings = UpdateBenchSettings(
        args.algo,
        args.updates_per_call,
        args.batch_size,
        args.min_seconds,
        anatomy_from=args.anatomy_from,
        kernel_times=args.kernel_times,
    )
    result = bench_update(settings, args.pop, args.impl)
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


def add_checkpoint_parser(bench) -> argparse.ArgumentParser:
    """Adds `checkpoint` to the `fastpop bench` subcommands."""
    parser = bench.add_parser(
        "checkpoint",
        help="bytes and seconds of saving and restoring a run's checkpoint",
        description="Size on disk and save / restore seconds of the checkpoint a training run "
        "writes for CONFIG (learner states, hparams, strategy state; replay buffers with "
        "--replay on), with buffers full of random rows; no training. Writes "
        "results/bench/checkpoint_<config name>_<device>.json.",
    )
    parser.add_argument(
        "config",
        type=Path,
        nargs="?",
        default=checkpoint.DEFAULT_CONFIG,
        help=f"YAML preset (default {checkpoint.DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable), e.g. replay.capacity=100000",
    )
    parser.add_argument(
        "--replay",
        default="on,off",
        help="checkpoints with (on) and / or without (off) the replay buffers, comma-separated "
        "(default on,off)",
    )
    parser.add_argument(
        "--repeats",
        type=positive_int_arg("repeats"),
        default=3,
        help="saves and restores per setting; median and min are reported (default 3)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where checkpoints are written (the write time depends on this disk); default: "
        "a temporary directory under the system's, removed afterwards",
    )
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    return parser


def run_checkpoint(args: argparse.Namespace) -> int:
    """The `fastpop bench checkpoint` handler: 0, 2 on bad input, 1 if a restore differs."""
    from fastpop import config as config_lib

    try:
        settings = checkpoint.parse_replay_settings(args.replay)
        config = config_lib.load_config(args.config, args.overrides)
        if args.dir is not None and args.dir.exists() and not args.dir.is_dir():
            raise ValueError(f"--dir {args.dir}: exists and is not a directory")
        learner = build_learner(config)
        # Shapes only: refuse before the (slow) fill what the disk or the memory cannot hold.
        largest = max(tree_bytes(learner.saved_tree(s == "on")) for s in settings)
        if args.dir is not None:
            args.dir.mkdir(parents=True, exist_ok=True)
        parent = args.dir if args.dir is not None else Path(tempfile.gettempdir())
        free = checkpoint.check_disk(parent, 2 * largest)
        checkpoint.check_host_memory(largest)
    except (config_lib.ConfigError, ValueError) as error:
        return fail(str(error))
    start = time.perf_counter()
    inserts = fill_replay(learner, config.seed)
    fill = {"inserts": inserts, "seconds": time.perf_counter() - start}  # every lane full
    rows = checkpoint.measure_settings(learner, settings, args.repeats, parent)
    result = checkpoint.result_record(args, learner, rows, fill, free)
    print(checkpoint.format_table(result))
    print(f"wrote {checkpoint.write_results(result, args.out)}")
    return (
        0
        if all(row["round_trip_equal"] for row in rows)
        else fail("a restored learner differs from the saved one", code=1)
    )

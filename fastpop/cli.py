"""The `fastpop` command line: fastpop bench update ..."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from fastpop import bench_checkpoint, evaluate
from fastpop.agents import ALGORITHMS
from fastpop.run_state import SAFE_ON_RESUME

IMPLEMENTATIONS = ("vectorized", "sequential", "torch")


def comma_list(parse_item: Callable[[str], object], what: str, allowed: Sequence | None = None):
    """argparse type for 'a,b,c' lists; bad items give a message naming what is allowed."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {what} list")
        values = []
        for item in items:
            try:
                value = parse_item(item)
            except ValueError as error:
                raise argparse.ArgumentTypeError(f"{what} {item!r}: {error}") from None
            if allowed is not None and value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"unknown {what} {item!r}; choose from {', '.join(allowed)}"
                )
            values.append(value)
        return values

    return parse


def one_of(what: str, allowed: Sequence[str]):
    """argparse type for one choice, with the same message on every Python version."""

    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; choose from {', '.join(allowed)}"
            )
        return text

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not an integer") from None
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def positive_int_arg(what: str):
    def parse(text: str) -> int:
        try:
            return positive_int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: {error}") from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastpop", description="Vectorized population training of off-policy RL agents."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(
        dest="bench", required=True
    )
    update = bench.add_parser(
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

    pipeline = bench.add_parser(
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

    bench_checkpoint.add_parser(bench)

    train = commands.add_parser(
        "train",
        help="train a population with collector processes",
        description="Train a population from a YAML preset (configs/) with --set overrides. "
        "Writes results/runs/<name>/ (or --out): config.yaml, metrics.jsonl, TensorBoard "
        "events, summary.json, the return plots and checkpoints/ (every "
        "checkpoint.interval_seconds and at every stop; continue with fastpop resume).",
    )
    train.add_argument(
        "config",
        type=Path,
        nargs="?",
        default=None,
        help="YAML preset, e.g. configs/td3_pendulum_cpu.yaml (default: defaults)",
    )
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value (repeatable)",
    )
    train.add_argument("--out", type=Path, default=None, help="run directory")
    train.add_argument("--overwrite", action="store_true", help="replace an existing run directory")

    resume = commands.add_parser(
        "resume",
        help="continue a run from its newest checkpoint",
        description="Continue RUN_DIR from its newest complete checkpoint (an unusable one is "
        "named and the previous one used): member states, optimizers, replay (if saved), "
        "strategy state, counters and wall time; metrics continue without repeated rows. "
        "--set may change only what does not change the saved state's meaning: "
        + ", ".join(SAFE_ON_RESUME),
    )
    resume.add_argument("run_dir", type=Path, help="the run directory (results/runs/<name>)")
    resume.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change a resume-safe value, e.g. train.total_env_steps=2000000 (repeatable)",
    )

    evaluate.add_parser(commands)

    plot = commands.add_parser("plot", help="walltime-vs-return and steps-vs-return plots")
    plot.add_argument("runs", type=Path, nargs="+", help="run directories")
    plot.add_argument("--out", type=Path, default=None, help="output directory")
    plot.add_argument(
        "--hparams",
        action="store_true",
        help="instead draw each run's hyperparameters per member and the best member's family "
        "tree (hparams.png)",
    )
    plot.add_argument(
        "--table",
        action="store_true",
        help="also print a markdown table of each run's best return at --minutes",
    )
    plot.add_argument(
        "--minutes",
        type=comma_list(float, "minutes"),
        default=[5.0, 10.0, 20.0],
        help="wall-clock minutes of the --table columns, comma-separated (default 5,10,20)",
    )
    return parser


def run_bench_update(args: argparse.Namespace) -> int:
    from fastpop.bench import bench_update, write_results

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


def run_bench_pipeline(args: argparse.Namespace) -> int:
    from fastpop.bench_pipeline import bench_pipeline, write_pipeline_results
    from fastpop.config import ConfigError

    try:
        result = bench_pipeline(
            args.env, args.pop, args.collectors, args.seconds, args.train_seconds
        )
    except (ConfigError, ValueError) as error:
        return fail(str(error))
    print(f"wrote {write_pipeline_results(result, args.out)}")
    return 0


def fail(message: str, code: int = 2) -> int:
    print(f"fastpop: error: {message}", file=sys.stderr)
    return code


def run_train(args: argparse.Namespace) -> int:
    from fastpop.config import ConfigError, load_config
    from fastpop.resume import lock_run_directory
    from fastpop.train import Run

    try:
        config = load_config(args.config, args.overrides)
        run_dir = args.out or Path("results/runs") / config.name
        if run_dir.exists() and any(run_dir.iterdir()) and not args.overwrite:
            raise ConfigError(
                f"run directory {run_dir} already exists; choose another --set name=... or "
                f"--out, pass --overwrite, or continue it with `fastpop resume {run_dir}`"
            )
        if args.overwrite and run_dir.exists():
            os.close(lock_run_directory(run_dir))  # never delete a live run
        run = Run(config, run_dir)  # refuses what cannot run before anything is written
        if args.overwrite and run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        descriptor = lock_run_directory(run_dir)
    except (ConfigError, ValueError) as error:
        return fail(str(error))
    try:
        return execute(run, run_dir)
    finally:
        os.close(descriptor)


def run_resume(args: argparse.Namespace) -> int:
    from fastpop.checkpoint import CheckpointError
    from fastpop.config import ConfigError
    from fastpop.resume import lock_run_directory, resume_run

    if not args.run_dir.is_dir():
        return fail(f"{args.run_dir}: no such run directory")
    try:
        descriptor = lock_run_directory(args.run_dir)
    except ConfigError as error:
        return fail(str(error))
    try:
        try:
            run = resume_run(args.run_dir, args.overrides)
        except (CheckpointError, ConfigError, ValueError) as error:
            return fail(str(error))
        return execute(run, args.run_dir)
    finally:
        os.close(descriptor)


def execute(run, run_dir: Path) -> int:
    """Run a prepared `Run`; write its summary and plots; the exit code."""
    import json

    from fastpop.collect.workers import WorkerFailed
    from fastpop.plot import plot_runs
    from fastpop.train import StopRequested, TrainError

    try:
        summary = run.run()
    except (WorkerFailed, TrainError) as error:
        return fail(str(error), code=1)
    except (KeyboardInterrupt, StopRequested) as stop:  # during start-up, or stopped at once
        print("stopping: interrupted", file=sys.stderr)
        return 143 if isinstance(stop, StopRequested) else 130
    from fastpop.metrics import read_metrics, summarize

    if (run_dir / "metrics.jsonl").exists() and (rows := read_metrics(run_dir)):
        summary["final_evaluation"] = final = summarize(rows)
        print(
            f"final evaluation: best member {final['best_member']} return "
            f"{final['best_return']:.1f}, population median {final['median_return']:.1f}"
        )
        if len(final["ranking"]) > 1:
            print(format_ranking(final["ranking"], (run_dir / "members.json")))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
    try:
        paths = plot_runs([run_dir])
        print("wrote " + ", ".join(str(p) for p in paths))
    except ValueError as error:  # no evaluation finished (e.g. interrupted at once)
        print(f"no plot: {error}")
    # The shell's convention: 128 + the signal number (SIGINT 2, SIGTERM 15).
    return {"interrupted": 130, "terminated": 143}.get(summary["stopped_by"], 0)


def format_ranking(ranking: list[dict], members_file: Path, shown: int = 10) -> str:
    """The members ranked by final return, with the hparams that differ between them."""
    import json

    members = json.loads(members_file.read_text())["members"] if members_file.exists() else []
    varying = sorted(
        name
        for name in (members[0]["hparams"] if members else {})
        if len({str(m["hparams"][name]) for m in members}) > 1
    )
    lines = ["members ranked by final evaluation return (hparams: at the last evaluation):"]
    for place, entry in enumerate(ranking[:shown], start=1):
        values = ", ".join(f"{n}={entry['hparams'].get(n, float('nan')):.4g}" for n in varying)
        lines.append(
            f"  {place:2d}. member {entry['member']:3d}  final {entry['final_return']:9.1f}  "
            f"best {entry['best_return']:9.1f}  {values}"
        )
    if len(ranking) > shown:
        lines.append(f"  ... {len(ranking) - shown} more in summary.json")
    return "\n".join(lines)


def run_plot(args: argparse.Namespace) -> int:
    from fastpop.lineage import plot_hparams
    from fastpop.plot import plot_runs, returns_table

    try:
        if args.hparams:
            if args.out is not None and len(args.runs) > 1:
                return fail("--hparams with several runs writes into each run; drop --out")
            paths = [plot_hparams(run, args.out) for run in args.runs]
        else:
            paths = plot_runs(args.runs, args.out)
        if args.table:
            print(returns_table(args.runs, tuple(args.minutes)))
    except ValueError as error:
        return fail(str(error))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and args.bench == "update":
        return run_bench_update(args)
    if args.command == "bench" and args.bench == "pipeline":
        return run_bench_pipeline(args)
    if args.command == "bench" and args.bench == "checkpoint":
        return bench_checkpoint.run(args)
    if args.command == "train":
        return run_train(args)
    if args.command == "resume":
        return run_resume(args)
    if args.command == "eval":
        return evaluate.run(args)
    if args.command == "plot":
        return run_plot(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

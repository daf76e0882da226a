"""The `fastpop` command line: fastpop train | resume | eval | export | pbt-replay | plot |
bench."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fastpop.commands import bench as bench_commands
from fastpop.commands import doctor, evaluate, export, pbt_replay
from fastpop.commands.args import comma_list, fail, one_of
from fastpop.compilation import compile_cache, compile_stats
from fastpop.distributed import flags as distributed_flags
from fastpop.gc_settings import tune_for_tracing
from fastpop.run.run_state import SAFE_ON_RESUME


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastpop", description="Vectorized population training of off-policy RL agents."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    bench_commands.add_parser(commands)
    add_train_parser(commands)
    add_resume_parser(commands)
    evaluate.add_parser(commands)
    export.add_parser(commands)
    pbt_replay.add_parser(commands)
    add_plot_parser(commands)
    doctor.add_parser(commands)
    return parser


def add_train_parser(commands) -> None:
    train = commands.add_parser(
        "train",
        help="train a population: its envs stepped in collector processes (gymnasium ids) or "
        "on the accelerator with the updates (brax, gymnax, playground ids)",
        description="Train a population from a YAML preset (configs/) with --set overrides. "
        "Gymnasium envs are stepped in collector processes next to the learner "
        "(collect.mode: processes); JAX envs (env.id: brax/<name>, gymnax/<name>, "
        "playground/<Name>) are stepped on the "
        "accelerator, in one compiled program with the updates and no worker processes "
        "(collect.mode: device). "
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
    train.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing run directory: only one fastpop wrote (it holds config.yaml "
        "and metrics.jsonl or checkpoints/, and no file fastpop does not write there) and no "
        "live run holds; anything else is refused and left as it is",
    )
    add_verbose(train)
    distributed_flags.add_arguments(train)


def add_verbose(parser) -> None:
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="name every program JAX compiles or loads from the compilation cache, with seconds",
    )


def add_resume_parser(commands) -> None:
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
    add_verbose(resume)
    distributed_flags.add_arguments(resume)


def add_plot_parser(commands) -> None:
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
        "--aggregate",
        action="store_true",
        help="instead draw the IQM and mean return of each group of members (see --by) with 95%% "
        "stratified bootstrap confidence bands against wall time and env steps, and their "
        "performance profiles; --table then gives IQM, mean, median and optimality gap with "
        "their intervals",
    )
    plot.add_argument(
        "--by",
        type=one_of("grouping", ("configuration", "run")),
        default=None,
        help="--aggregate groups: configuration (members.json's config_index, pooled over the "
        "runs given, one stratum per run) or run (one group per run, one stratum per "
        "configuration); default configuration",
    )
    plot.add_argument(
        "--gamma",
        type=float,
        default=None,
        help="--aggregate --table: the return the optimality gap is measured from (default: "
        "the best return any member reached)",
    )
    plot.add_argument(
        "--table",
        action="store_true",
        help="also print a markdown table of each run's best return at --minutes",
    )
    plot.add_argument(
        "--minutes",
        type=comma_list(float, "minutes"),
        default=None,
        help="wall-clock minutes of the --table columns, comma-separated (default: a quarter, "
        "half, three quarters and all of the longest run)",
    )


def run_train(args: argparse.Namespace) -> int:
    from fastpop.config import ConfigError, load_config

    try:
        if (arguments := distributed_flags.resolve(args)) is not None:
            from fastpop.commands import (
                train_distributed,  # jax.distributed starts before any JAX call
            )

            return train_distributed.train(args, arguments, execute)
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        return fail(str(error))
    return train_config(config, args.out or Path("results/runs") / config.name, args.overwrite)


def train_config(config, run_dir: Path, overwrite: bool) -> int:
    """Train `config` into `run_dir` (`fastpop train`, `fastpop pbt-replay`); an existing run
    there is refused (exit 2) unless `overwrite`, and anything else that is not empty always
    (fastpop.commands.run_directory)."""
    from fastpop.commands import run_directory
    from fastpop.config import ConfigError
    from fastpop.run.loop import CHECKPOINTS_DIR, Run
    from fastpop.run.parts import build_run
    from fastpop.run.startup import local_pieces

    descriptor = None
    try:
        try:
            run_directory.check(run_dir, overwrite)
            descriptor = run_directory.hold(run_dir, overwrite)  # never replace a live run
            # refuses what cannot run before anything is written
            parts = build_run(config)
            # a fresh run: its collectors start and step their warm-up while the learner is made
            pieces = local_pieces(parts, run_dir / CHECKPOINTS_DIR, collectors_ahead=True)
            run = Run(parts, run_dir, pieces=pieces)
            descriptor = run_directory.replace(run_dir, descriptor)
        except ConfigError as error:  # not any ValueError: JAX's own are not the user's input
            return fail(str(error))
        return execute(run, run_dir)
    finally:
        run_directory.release(descriptor)


def run_pbt_replay(args: argparse.Namespace) -> int:
    from fastpop.commands.pbt_replay import ReplayError, describe, plot_comparison, replay_config
    from fastpop.config import ConfigError

    try:
        replay = replay_config(args.run_dir, args.member, args.overrides, args.out)
    except (ReplayError, ConfigError, evaluate.EvalError) as error:
        return fail(str(error))
    print(describe(replay))
    code = train_config(replay.config, replay.out, args.overwrite)
    if code in (0, 130, 143) and (replay.out / "metrics.jsonl").is_file():
        print(f"wrote {plot_comparison(args.run_dir, replay.out, replay.member, replay.line)}")
    return code


def run_resume(args: argparse.Namespace) -> int:
    from fastpop.commands import train_distributed
    from fastpop.config import ConfigError
    from fastpop.run.checkpoint import CheckpointError
    from fastpop.run.resume import lock_run_directory, resume_run

    if not args.run_dir.is_dir():
        return fail(f"{args.run_dir}: no such run directory")
    try:
        arguments = distributed_flags.resolve(args)
    except ConfigError as error:
        return fail(str(error))
    if arguments is not None:
        return train_distributed.resume(args.run_dir, args.overrides, arguments, execute)
    if hint := train_distributed.sharded_hint(args.run_dir):
        return fail(hint)
    try:
        descriptor = lock_run_directory(args.run_dir)
    except ConfigError as error:
        return fail(str(error))
    try:
        try:
            run = resume_run(args.run_dir, args.overrides)
        except (CheckpointError, ConfigError) as error:
            return fail(str(error))
        return execute(run, args.run_dir)
    finally:
        os.close(descriptor)


def execute(run, run_dir: Path) -> int:
    """Run a prepared `Run`; write its summary and plots; the exit code."""
    from fastpop.analysis.plot import plot_runs
    from fastpop.collect.workers import WorkerFailed
    from fastpop.run import metrics, run_files
    from fastpop.run.loop import StopRequested, TrainError

    try:
        summary = run.run()
    except (WorkerFailed, TrainError) as error:
        return fail(str(error), code=1)
    except (KeyboardInterrupt, StopRequested) as stop:  # during start-up, or stopped at once
        print("stopping: interrupted", file=sys.stderr)
        return 143 if isinstance(stop, StopRequested) else 130
    if (run_dir / "metrics.jsonl").exists() and (rows := run_files.read_metrics(run_dir)):
        summary["final_evaluation"] = final = run_files.summarize(rows)
        print(
            f"final evaluation: best member {final['best_member']} return "
            f"{final['best_return']:.1f}, population median {final['median_return']:.1f}"
        )
        if len(final["ranking"]) > 1:
            print(format_ranking(final["ranking"], (run_dir / "members.json")))
    metrics.write_summary(run_dir, summary)
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
    from fastpop.analysis.lineage import plot_hparams
    from fastpop.analysis.plot import plot_runs, returns_table
    from fastpop.analysis.plot_aggregate import aggregate_table, plot_aggregate

    if args.aggregate and args.hparams:
        return fail("--aggregate and --hparams draw different plots; choose one")
    if not args.aggregate and (args.by is not None or args.gamma is not None):
        return fail("--by and --gamma choose how --aggregate groups and scores; add --aggregate")
    by = args.by or "configuration"
    if args.gamma is not None and not math.isfinite(args.gamma):
        return fail(f"--gamma must be a finite return, got {args.gamma}")
    try:
        if args.hparams:
            if args.out is not None and len(args.runs) > 1:
                return fail("--hparams with several runs writes into each run; drop --out")
            paths = [plot_hparams(run, args.out) for run in args.runs]
        elif args.aggregate:
            paths = plot_aggregate(args.runs, args.out, by, args.gamma)
        else:
            paths = plot_runs(args.runs, args.out)
        if args.table and args.aggregate:
            print(
                aggregate_table(
                    args.runs, None if args.minutes is None else tuple(args.minutes), by, args.gamma
                )
            )
        elif args.table:
            print(returns_table(args.runs, None if args.minutes is None else tuple(args.minutes)))
    except ValueError as error:
        return fail(str(error))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    tune_for_tracing()  # `python -m fastpop` did before its imports; the `fastpop` script did not
    args = build_parser().parse_args(argv)
    handlers = {
        "bench": bench_commands.run,
        "train": run_train,
        "resume": run_resume,
        "eval": evaluate.run,
        "export": export.run,
        "pbt-replay": run_pbt_replay,
        "plot": run_plot,
        "doctor": doctor.run,
    }
    if args.command not in ("bench", "doctor"):  # these time compiles: bench opts in itself
        compile_cache.enable()
    compile_stats.install(print if getattr(args, "verbose", False) else None)
    if getattr(args, "verbose", False):
        print(f"compilation cache: {compile_cache.status()}")
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:  # Ctrl-C before a run handles it (imports, building, compiling)
        print("stopping: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

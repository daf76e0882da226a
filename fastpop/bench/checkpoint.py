"""Checkpoint benchmark: bytes on disk and seconds of one save and one restore of a run's state.

    fastpop bench checkpoint [CONFIG] [--set K=V ...] [--replay on,off] [--repeats N]

Builds the config's learner (no collectors, no training), fills every replay buffer with random
rows of the right dtypes, then saves and restores what a training run checkpoints, with and
without the replay buffers (`checkpoint_timing`: each save split into its phases, arrays to
host, npz write, checksum, fsync; each restore read from the disk, not the page cache). Writes
results/bench/checkpoint_<config name>_<device>.json.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import shutil
import tempfile
from pathlib import Path

from fastpop.bench.checkpoint_timing import measure_setting
from fastpop.bench.common import (
    available_host_bytes,
    device_label,
    machine_description,
    write_json,
)

DEFAULT_CONFIG = Path("configs/td3_pbt_halfcheetah.yaml")
REPLAY_SETTINGS = ("on", "off")
# Left free on the checkpoint's disk beyond what the benchmark writes.
DISK_RESERVE_BYTES = 1 << 30


def parse_replay_settings(text: str) -> list[str]:
    """'on,off' -> ['on', 'off'] (duplicates dropped); ValueError names what is allowed."""
    settings = [item.strip() for item in text.split(",") if item.strip()]
    if not settings:
        raise ValueError("--replay: empty list; choose from on, off")
    for setting in settings:
        if setting not in REPLAY_SETTINGS:
            raise ValueError(f"--replay: unknown setting {setting!r}; choose from on, off")
    return list(dict.fromkeys(settings))


def command_line(args: argparse.Namespace) -> str:
    """The `fastpop bench checkpoint` command these arguments stand for."""
    words = ["fastpop", "bench", "checkpoint", str(args.config)]
    for override in args.overrides:
        words += ["--set", override]
    words += ["--replay", args.replay, "--repeats", str(args.repeats)]
    if args.dir is not None:
        words += ["--dir", str(args.dir)]
    return shlex.join([*words, "--out", str(args.out)])


def check_disk(directory: Path, needed: int) -> int:
    """Free bytes under `directory`; ValueError when `needed` plus a reserve do not fit."""
    free = shutil.disk_usage(directory).free
    if needed + DISK_RESERVE_BYTES > free:
        raise ValueError(
            f"--dir {directory}: the checkpoints need about {needed / 1e9:.2f} GB (two at once "
            f"while a save replaces the previous one) and 1 GB is kept free, but only "
            f"{free / 1e9:.2f} GB is free there; choose another --dir or lower replay.capacity "
            "with --set"
        )
    return free


def check_host_memory(checkpoint_bytes: int) -> None:
    """ValueError when a restore cannot fit: it holds the loaded arrays and their device
    copies (on a CPU, host memory too) while the learner's own are still alive."""
    available = available_host_bytes()
    if available is not None and 2 * checkpoint_bytes > available:
        raise ValueError(
            f"restoring a {checkpoint_bytes / 1e9:.2f} GB checkpoint needs about "
            f"{2 * checkpoint_bytes / 1e9:.2f} GB of host memory beyond the learner's, but only "
            f"{available / 1e9:.2f} GB is available; lower replay.capacity with --set, measure, "
            "and scale the replay-on figures by the capacity (they grow linearly with it)"
        )


def format_table(result: dict) -> str:
    def both(seconds: dict) -> str:
        return f"{seconds['median']:.2f} / {seconds['min']:.2f}"

    lines = [
        f"{result['config']}: population {result['population']}, "
        f"{result['replay_capacity_per_member']:,} transitions per member",
        f"{'replay':>6} | {'size':>9} | {'save s (median / min)':>22} | "
        f"{'restore s (median / min)':>24}",
    ]
    for row in result["results"]:
        size = row["bytes"]
        shown = f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"
        lines.append(
            f"{row['replay']:>6} | {shown:>9} | {both(row['save_seconds']):>22} | "
            f"{both(row['restore_seconds']):>24}"
        )
    return "\n".join(lines)


def write_results(result: dict, out_dir: Path) -> Path:
    return write_json(result, out_dir / f"checkpoint_{result['config']}_{result['device']}.json")


def measure_settings(learner, settings: list[str], repeats: int, parent: Path) -> list[dict]:
    """One row per replay setting, its checkpoints written in a fresh directory under `parent`
    that is removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="fastpop-bench-checkpoint-", dir=parent))
    rows = []
    try:
        for setting in settings:
            print(f"replay {setting}: {repeats} saves and restores ...", flush=True)
            rows.append(
                measure_setting(learner, setting == "on", repeats, work / f"replay_{setting}")
            )
            shutil.rmtree(work / f"replay_{setting}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def result_record(args: argparse.Namespace, learner, rows: list[dict], fill: dict, free: int):
    """The JSON written: the rows with what they were measured on and how to measure again."""
    import jax
    import numpy as np

    from fastpop import config as config_lib
    from fastpop.population import replay

    config = learner.config
    capacity, _ = config_lib.replay_layout(config)
    interval = config.checkpoint.interval_seconds
    for row in rows:
        row["save_share_of_interval"] = (
            row["save_seconds"]["median"] / interval if interval else None
        )
    return {
        "benchmark": "checkpoint",
        "config": config.name,
        "config_file": str(args.config),
        "overrides": list(args.overrides),
        "algo": config.algo,
        "strategy": config.strategy,
        "env": config.env.id,
        "population": config.population.size,
        "replay_capacity_per_member": config.replay.capacity,
        "replay_shared": config.replay.shared,
        "replay_bytes_per_transition": replay.memory_estimate_bytes(learner.replay.spec) / capacity,
        "checkpoint_interval_seconds": interval,
        "replay_fill": fill,
        "repeats": args.repeats,
        "device": device_label(),
        "jax_version": jax.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "machine": machine_description(),
        "checkpoint_dir": str(args.dir) if args.dir is not None else "system temp directory",
        "disk_free_bytes_before": free,
        "command": command_line(args),
        "results": rows,
    }

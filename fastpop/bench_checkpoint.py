"""Checkpoint benchmark: bytes on disk and seconds of one save and one restore of a run's state.

    fastpop bench checkpoint [CONFIG] [--set K=V ...] [--replay on,off] [--repeats N]

Builds the config's learner (no collectors, no training), fills every replay buffer with random
rows of the right dtypes, then saves and restores what a training run checkpoints
(`Learner.saved_tree` and `saved_counters`, through `fastpop.checkpoint`), with and without the
replay buffers. Each save is split into its phases by timing `fastpop.checkpoint`'s own helpers
around the real call: arrays to host, npz write, checksum, fsync. Before each restore the
checkpoint's files are dropped from the page cache, as for a resume in a new process long after
the save. Writes results/bench/checkpoint_<config name>_<device>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

DEFAULT_CONFIG = Path("configs/td3_pbt_halfcheetah.yaml")
REPLAY_SETTINGS = ("on", "off")
# Helpers of fastpop.checkpoint timed inside the real save/restore; the remainder of a save is
# the npz write (plus the manifest, renames and pruning), of a restore the npz read.
SAVE_PHASES = {"_plain_leaves": "to_host", "_sha256": "checksum", "_fsync": "fsync"}
RESTORE_PHASES = {"_sha256": "verify"}
# Left free on the checkpoint's disk beyond what the benchmark writes.
DISK_RESERVE_BYTES = 1 << 30


def add_parser(bench) -> argparse.ArgumentParser:
    """Adds `checkpoint` to the `fastpop bench` subcommands."""
    from fastpop.cli import positive_int_arg  # lazily: fastpop.cli imports this module

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
        default=DEFAULT_CONFIG,
        help=f"YAML preset (default {DEFAULT_CONFIG})",
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


def random_rows(learner, rng: np.random.Generator):
    """One insert's rows (population * envs_per_member lanes, chunk_len) with random values of
    the buffer's dtypes: uncompressed npz costs the same for any content, but a disk or VM that
    skips zero blocks would make all-zero buffers look cheaper than real ones."""
    from fastpop import replay

    config = learner.config
    lanes = config.population.size * config.collect.envs_per_member
    layout = replay.row_layout(learner.replay_spec, (lanes, config.collect.chunk_len))

    def leaf(spec):
        if spec.dtype == np.bool_:
            return rng.random(spec.shape) < 0.01
        if np.issubdtype(spec.dtype, np.floating):
            return rng.standard_normal(spec.shape, dtype=spec.dtype)
        return rng.integers(0, np.iinfo(spec.dtype).max, spec.shape, dtype=spec.dtype)

    return replay.Rows(*(leaf(spec) for spec in layout))


def fill_replay(learner, seed: int = 0) -> int:
    """Inserts random rows until every lane of every buffer is full; returns the inserts."""
    spec = learner.replay_spec
    inserts = math.ceil(spec.lane_capacity / spec.chunk_len)
    rng = np.random.default_rng(seed)
    for _ in range(inserts):
        learner.insert(random_rows(learner, rng))
    _block(learner.buffers)
    return inserts


def _block(tree) -> None:
    import jax

    jax.block_until_ready(jax.tree.leaves(tree))


def tree_bytes(tree) -> int:
    """Bytes of a tree's arrays (PRNG keys as their key data), without copying them."""
    import jax

    def plain(leaf):
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            return jax.random.key_data(leaf)
        return leaf if hasattr(leaf, "nbytes") else np.asarray(leaf)

    return sum(plain(leaf).nbytes for leaf in jax.tree.leaves(tree))


def trees_equal(a, b) -> bool:
    import jax

    def plain(leaf):
        if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        return np.asarray(leaf)

    if jax.tree.structure(a) != jax.tree.structure(b):
        return False
    return all(
        x.dtype == y.dtype and np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.inexact))
        for x, y in zip(map(plain, jax.tree.leaves(a)), map(plain, jax.tree.leaves(b)), strict=True)
    )


@contextlib.contextmanager
def timed_helpers(module, phases: dict[str, str]) -> Iterator[dict[str, float]]:
    """Seconds spent in `module`'s helper functions `phases` (name -> label) while the block
    runs, by wrapping them; helpers the module no longer has are left out of the result."""
    seconds: dict[str, float] = {}
    originals = {name: getattr(module, name) for name in phases if hasattr(module, name)}

    def timed(function, label):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[label] = seconds.get(label, 0.0) + time.perf_counter() - start

        return call

    for name, function in originals.items():
        seconds[phases[name]] = 0.0
        setattr(module, name, timed(function, phases[name]))
    try:
        yield seconds
    finally:
        for name, function in originals.items():
            setattr(module, name, function)


def evict_from_page_cache(path: Path) -> bool:
    """Drops the (fsynced, so clean) pages of the files under `path` from the page cache, so
    that a restore reads from the disk. False where the platform cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for file in path.iterdir():
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _memory_status() -> dict[str, int]:
    """Resident memory now (VmRSS) and its peak (VmHWM) in bytes, from /proc (Linux)."""
    sizes = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            sizes[name] = int(value.split()[0]) * 1024  # kB
    return sizes


class HostMemory:
    """The process's resident memory from now on: its peak, and the peak above now (Linux: the
    kernel's high-water mark, reset through /proc/self/clear_refs); None elsewhere."""

    def __init__(self):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak to the current
            self.start = _memory_status()["VmRSS"]
        except (OSError, KeyError):
            self.start = None

    def peak(self) -> int | None:
        return None if self.start is None else _memory_status()["VmHWM"]

    def peak_above_start(self) -> int | None:
        return None if self.start is None else _memory_status()["VmHWM"] - self.start


def disk_bytes(path: Path) -> tuple[int, int]:
    """(sum of file sizes, bytes allocated on disk) of the files under `path`."""
    files = [f.stat() for f in path.rglob("*") if f.is_file()]
    return sum(s.st_size for s in files), sum(s.st_blocks * 512 for s in files)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "all": values}


def optional_summary(values: list) -> dict | None:
    return None if None in values else summary(values)


def measure_setting(learner, with_replay: bool, repeats: int, directory: Path) -> dict:
    """Saves and restores the learner's checkpoint `repeats` times under `directory`."""
    import jax

    from fastpop import checkpoint
    from fastpop import config as config_lib

    config = learner.config
    reference = learner.saved_tree(with_replay)  # what the first restore must give back
    leaves, array_bytes = len(jax.tree.leaves(reference)), tree_bytes(reference)
    counters = learner.saved_counters()
    metadata = {
        "config": config_lib.config_to_dict(config),
        "learner": counters,
        "run": {"benchmark": "fastpop bench checkpoint"},
    }
    saves, restores, save_phases, restore_phases = [], [], [], []
    save_memory, restore_memory, save_peaks, restore_peaks = [], [], [], []
    sizes, evicted, round_trip = [], True, True
    rng = np.random.default_rng(config.seed + 1)
    for step in range(1, repeats + 1):
        tree = {"learner": learner.saved_tree(with_replay), "pending": []}
        # keep=1: from the second save on, each save also deletes the previous checkpoint, as
        # a running training run's saves do once `checkpoint.keep` are on disk.
        memory = HostMemory()
        with timed_helpers(checkpoint, SAVE_PHASES) as phases:
            start = time.perf_counter()
            path = checkpoint.save(directory, step, tree, metadata, keep=1)
            saves.append(time.perf_counter() - start)
        save_memory.append(memory.peak_above_start())
        save_peaks.append(memory.peak())
        phases["write"] = saves[-1] - sum(phases.values())
        save_phases.append(phases)
        sizes.append(disk_bytes(path))
        del tree
        evicted = evict_from_page_cache(path) and evicted

        template = {"learner": learner.saved_tree(with_replay), "pending": []}
        memory = HostMemory()
        with timed_helpers(checkpoint, RESTORE_PHASES) as phases:
            start = time.perf_counter()
            restored, saved_metadata = checkpoint.restore(path, template)
            phases["read"] = time.perf_counter() - start - sum(phases.values())
            del template
            start_device = time.perf_counter()
            learner.restore(restored["learner"], saved_metadata["learner"])
            _block(learner.saved_tree(with_replay))
            phases["to_device"] = time.perf_counter() - start_device
            restores.append(time.perf_counter() - start)
        restore_memory.append(memory.peak_above_start())
        restore_peaks.append(memory.peak())
        restore_phases.append(phases)
        del restored
        if step == 1:  # a full comparison reads every byte again: once is enough
            # Without buffers the rate limiter restarts on purpose (the replay refills), so
            # only the counters outside it must come back.
            kept = None if with_replay else ("updates", "inserted", "strategy")
            now = learner.saved_counters()
            round_trip = trees_equal(learner.saved_tree(with_replay), reference) and all(
                now[name] == counters[name] for name in kept or counters
            )
            del reference  # holds the original buffers: a second copy of the replay
        # A run inserts before its next save, which replaces the buffers restored from numpy
        # arrays by XLA's own; saving the restored ones instead would copy them to the host.
        learner.insert(random_rows(learner, rng))
        _block(learner.buffers)
    size, allocated = sizes[-1]
    return {
        "replay": "on" if with_replay else "off",
        "leaves": leaves,
        "array_bytes": array_bytes,
        "bytes": size,
        "allocated_bytes": allocated,
        "save_seconds": summary(saves),
        "save_phases_seconds": {
            name: summary([p[name] for p in save_phases]) for name in save_phases[0]
        },
        "restore_seconds": summary(restores),
        "restore_phases_seconds": {
            name: summary([p[name] for p in restore_phases]) for name in restore_phases[0]
        },
        "restore_from": "disk (page cache dropped)" if evicted else "page cache",
        # Host memory during the calls: the peak above what the process held before the call
        # (the first restore allocates afresh, as a resume does; later ones reuse freed
        # memory), and the process's peak resident memory.
        "save_host_peak_above_start_bytes": optional_summary(save_memory),
        "restore_host_peak_above_start_bytes": optional_summary(restore_memory),
        "save_process_peak_bytes": None if None in save_peaks else max(save_peaks),
        "restore_process_peak_bytes": None if None in restore_peaks else max(restore_peaks),
        "round_trip_equal": bool(round_trip),
    }


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def total_memory_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


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


def available_host_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


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
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"checkpoint_{result['config']}_{result['device']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def run(args: argparse.Namespace) -> int:
    from fastpop import config as config_lib
    from fastpop.cli import fail

    try:
        settings = parse_replay_settings(args.replay)
        config = config_lib.load_config(args.config, args.overrides)
        if args.dir is not None and args.dir.exists() and not args.dir.is_dir():
            raise ValueError(f"--dir {args.dir}: exists and is not a directory")
    except (config_lib.ConfigError, ValueError) as error:
        return fail(str(error))

    import jax

    from fastpop import replay
    from fastpop.bench import device_label
    from fastpop.learner import Learner, prepare

    try:
        learner = Learner(config, *prepare(config))
    except (config_lib.ConfigError, ValueError) as error:
        return fail(str(error))
    # Shapes only: refuse before the (slow) fill what the disk or the memory cannot hold.
    largest = max(tree_bytes(learner.saved_tree(s == "on")) for s in settings)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    parent = args.dir if args.dir is not None else Path(tempfile.gettempdir())
    try:
        free = check_disk(parent, 2 * largest)
        check_host_memory(largest)
    except ValueError as error:
        return fail(str(error))
    start = time.perf_counter()
    inserts = fill_replay(learner, config.seed)
    fill_seconds = time.perf_counter() - start
    work = Path(tempfile.mkdtemp(prefix="fastpop-bench-checkpoint-", dir=parent))
    rows = []
    try:
        for setting in settings:
            print(f"replay {setting}: {args.repeats} saves and restores ...", flush=True)
            rows.append(
                measure_setting(learner, setting == "on", args.repeats, work / f"replay_{setting}")
            )
            shutil.rmtree(work / f"replay_{setting}")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    capacity, _ = config_lib.replay_layout(config)
    interval = config.checkpoint.interval_seconds
    for row in rows:
        row["save_share_of_interval"] = (
            row["save_seconds"]["median"] / interval if interval else None
        )
    result = {
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
        "replay_bytes_per_transition": replay.memory_estimate_bytes(learner.replay_spec) / capacity,
        "checkpoint_interval_seconds": interval,
        "replay_fill": {"inserts": inserts, "seconds": fill_seconds},  # every lane full
        "repeats": args.repeats,
        "device": device_label(),
        "jax_version": jax.__version__,
        "numpy_version": np.__version__,
        "python": platform.python_version(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "cpu": cpu_model(),
            "platform": platform.platform(),
            "memory_bytes": total_memory_bytes(),
        },
        "checkpoint_dir": str(args.dir) if args.dir is not None else "system temp directory",
        "disk_free_bytes_before": free,
        "command": command_line(args),
        "results": rows,
    }
    print(format_table(result))
    print(f"wrote {write_results(result, args.out)}")
    return (
        0
        if all(row["round_trip_equal"] for row in rows)
        else fail("a restored learner differs from the saved one", code=1)
    )

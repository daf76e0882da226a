"""Timed saves and restores of a learner's checkpoint, for `fastpop bench checkpoint`.

Each round saves what a training run checkpoints (`Learner.saved_tree` and `saved_counters`,
through `run/checkpoint.py`), drops the files from the page cache (a resume in a new process long
after the save reads them from the disk), restores them into the learner, and inserts one chunk
of random rows, as a run does between two saves.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fastpop.bench.common import HostMemory
from fastpop.run import checkpoint

# `checkpoint.save` and `restore` are single calls: their phases are only visible inside them,
# through these helpers of fastpop.run.checkpoint (name -> phase). The rest of a save is the npz
# write (plus the manifest, renames and pruning), of a restore the npz read.
SAVE_PHASES = {"_plain_leaves": "to_host", "_sha256": "checksum", "_fsync": "fsync"}
RESTORE_PHASES = {"_sha256": "verify"}


class PhaseTimer:
    """Seconds spent in `fastpop.run.checkpoint`'s helpers `phases` (name -> phase) while the block
    runs, by wrapping them for its duration. A helper the module no longer has is an error, not
    a phase silently left out of the results."""

    def __init__(self, phases: dict[str, str]):
        missing = [name for name in phases if not hasattr(checkpoint, name)]
        if missing:
            raise RuntimeError(
                f"run/checkpoint.py has no {', '.join(missing)}; update the phases in {__name__}"
            )
        self.phases = phases
        self.seconds = dict.fromkeys(phases.values(), 0.0)
        self.originals = {name: getattr(checkpoint, name) for name in phases}

    def _timed(self, function, phase):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - start

        return call

    def __enter__(self) -> dict[str, float]:
        for name, function in self.originals.items():
            setattr(checkpoint, name, self._timed(function, self.phases[name]))
        return self.seconds

    def __exit__(self, *exception) -> None:
        for name, function in self.originals.items():
            setattr(checkpoint, name, function)


class Timed(NamedTuple):
    """One save or restore: seconds in all and per phase, and host memory during it."""

    seconds: float
    phases: dict[str, float]
    host_peak_above_start: int | None  # None where the platform cannot tell
    process_peak: int | None


def random_rows(learner, rng: np.random.Generator):
    """One insert's rows (population * envs_per_member lanes, chunk_len) with random values of
    the buffer's dtypes: uncompressed npz costs the same for any content, but a disk or VM that
    skips zero blocks would make all-zero buffers look cheaper than real ones."""
    from fastpop.population import replay

    config = learner.config
    lanes = config.population.size * config.collect.envs_per_member
    layout = replay.row_layout(learner.replay.spec, (lanes, config.collect.chunk_len))

    def leaf(spec):
        if spec.dtype == np.bool_:
            return rng.random(spec.shape) < 0.01
        if np.issubdtype(spec.dtype, np.floating):
            return rng.standard_normal(spec.shape, dtype=spec.dtype)
        return rng.integers(0, np.iinfo(spec.dtype).max, spec.shape, dtype=spec.dtype)

    return replay.Rows(*(leaf(spec) for spec in layout))


def fill_replay(learner, seed: int = 0) -> int:
    """Inserts random rows until every lane of every buffer is full; returns the inserts."""
    spec = learner.replay.spec
    inserts = math.ceil(spec.lane_capacity / spec.chunk_len)
    rng = np.random.default_rng(seed)
    for _ in range(inserts):
        learner.insert(random_rows(learner, rng))
    block(learner.buffers)
    return inserts


def block(tree) -> None:
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


def disk_bytes(path: Path) -> tuple[int, int]:
    """(sum of file sizes, bytes allocated on disk) of the files under `path`."""
    files = [f.stat() for f in path.rglob("*") if f.is_file()]
    return sum(s.st_size for s in files), sum(s.st_blocks * 512 for s in files)


def timed_save(learner, with_replay: bool, directory: Path, step: int, metadata: dict):
    """(the checkpoint's path, Timed) of one save of the learner's checkpoint."""
    tree = {"learner": learner.saved_tree(with_replay), "pending": []}
    memory = HostMemory()
    with PhaseTimer(SAVE_PHASES) as phases:
        start = time.perf_counter()
        # keep=1: from the second save on, each save also deletes the previous checkpoint, as
        # a running training run's saves do once `checkpoint.keep` are on disk.
        path = checkpoint.save(directory, step, tree, metadata, keep=1)
        seconds = time.perf_counter() - start
    phases["write"] = seconds - sum(phases.values())
    return path, Timed(seconds, phases, memory.peak_above_start(), memory.peak())


def timed_restore(learner, with_replay: bool, path: Path) -> Timed:
    """One restore of the checkpoint at `path` into the learner, until its arrays are on the
    device."""
    template = {"learner": learner.saved_tree(with_replay), "pending": []}
    memory = HostMemory()
    with PhaseTimer(RESTORE_PHASES) as phases:
        start = time.perf_counter()
        restored, saved_metadata = checkpoint.restore(path, template)
        phases["read"] = time.perf_counter() - start - sum(phases.values())
        del template  # it refers to the buffers that learner.restore frees before copying in
        start_device = time.perf_counter()
        learner.restore(restored["learner"], saved_metadata["learner"])
        block(learner.saved_tree(with_replay))
        phases["to_device"] = time.perf_counter() - start_device
        seconds = time.perf_counter() - start
    return Timed(seconds, phases, memory.peak_above_start(), memory.peak())


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "all": values}


def optional_summary(values: list) -> dict | None:
    return None if None in values else summary(values)


def phase_summaries(timings: list[Timed]) -> dict[str, dict]:
    return {name: summary([t.phases[name] for t in timings]) for name in timings[0].phases}


def measure_setting(learner, with_replay: bool, repeats: int, directory: Path) -> dict:
    """Saves and restores the learner's checkpoint `repeats` times under `directory`."""
    import jax

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
    saves, restores, evicted, round_trip = [], [], True, True
    rng = np.random.default_rng(config.seed + 1)
    for step in range(1, repeats + 1):
        path, save = timed_save(learner, with_replay, directory, step, metadata)
        saves.append(save)
        size, allocated = disk_bytes(path)
        evicted = evict_from_page_cache(path) and evicted
        restores.append(timed_restore(learner, with_replay, path))
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
        block(learner.buffers)
    save_peaks, restore_peaks = [t.process_peak for t in saves], [t.process_peak for t in restores]
    return {
        "replay": "on" if with_replay else "off",
        "leaves": leaves,
        "array_bytes": array_bytes,
        "bytes": size,
        "allocated_bytes": allocated,
        "save_seconds": summary([t.seconds for t in saves]),
        "save_phases_seconds": phase_summaries(saves),
        "restore_seconds": summary([t.seconds for t in restores]),
        "restore_phases_seconds": phase_summaries(restores),
        "restore_from": "disk (page cache dropped)" if evicted else "page cache",
        # Host memory during the calls: the peak above what the process held before the call
        # (the first restore allocates afresh, as a resume does; later ones reuse freed
        # memory), and the process's peak resident memory.
        "save_host_peak_above_start_bytes": optional_summary(
            [t.host_peak_above_start for t in saves]
        ),
        "restore_host_peak_above_start_bytes": optional_summary(
            [t.host_peak_above_start for t in restores]
        ),
        "save_process_peak_bytes": None if None in save_peaks else max(save_peaks),
        "restore_process_peak_bytes": None if None in restore_peaks else max(restore_peaks),
        "round_trip_equal": bool(round_trip),
    }

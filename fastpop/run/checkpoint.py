"""Checkpoints as plain data: a pytree's leaves in an `.npz` (no pickle) plus a JSON manifest.

    <run>/checkpoints/000000123456/arrays.npz      leaf_0 ... leaf_N
    <run>/checkpoints/000000123456/manifest.json   format, version, step, every leaf's path,
                                                   shape and dtype, the sha256 of arrays.npz,
                                                   and caller metadata (counters, config, ...)

Writes are atomic: everything goes into a hidden temporary directory that is fsynced and then
renamed into place, so a checkpoint directory is either complete or absent; a crash mid-write
leaves only a `.tmp-*` directory, which readers ignore and the next save removes. Restoring
needs a template tree of the same structure (built from the config, as at the start of a run):
the structure never comes from the file, and a checkpoint whose leaves do not match the template
(another config, another fastpop) is refused with the first leaf that differs. A truncated or
corrupted file fails its checksum and is named in the error; `restore_latest` then falls back to
the previous complete checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

import jax
import numpy as np

FORMAT = "fastpop-checkpoint"
# 2: the members' clocks (versions, trials) in the learner's counters and the snapshots' trees,
# without which a halving trial's age and a late result's attribution cannot be restored
VERSION = 2
ARRAYS = "arrays.npz"
MANIFEST = "manifest.json"
TEMPORARY_PREFIX = ".tmp-"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names it and says why."""


def _is_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _plain_leaves(tree: Any) -> tuple[list[str], list[np.ndarray], list[str | None]]:
    """Leaf paths, leaves as numpy arrays (PRNG keys as their key data) and key impls."""
    paths, arrays, impls = [], [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        paths.append(jax.tree_util.keystr(path))
        if _is_key(leaf):
            impls.append(str(jax.random.key_impl(leaf)))
            leaf = jax.random.key_data(leaf)
        else:
            impls.append(None)
        arrays.append(np.asarray(leaf))
    return paths, arrays, impls


def _leaf_specs(tree: Any) -> list[tuple[str, tuple, np.dtype, str | None]]:
    """(path, shape, dtype, key impl) of every leaf, without copying a leaf to the host: a
    template may hold whole replay buffers."""
    specs = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        impl = None
        if _is_key(leaf):
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        elif not hasattr(leaf, "dtype"):
            leaf = np.asarray(leaf)
        specs.append((jax.tree_util.keystr(path), tuple(leaf.shape), np.dtype(leaf.dtype), impl))
    return specs


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_name(step: int) -> str:
    return f"{step:012d}"


def save(directory: Path, step: int, tree: Any, metadata: dict, keep: int = 3) -> Path:
    """Write `tree` and `metadata` (plain JSON data) as checkpoint `step` under `directory`,
    atomically; keep the newest `keep` complete checkpoints. Returns the checkpoint's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"{TEMPORARY_PREFIX}*"):  # a crash mid-write left it
        shutil.rmtree(stale, ignore_errors=True)
    final = directory / checkpoint_name(step)
    temporary = directory / f"{TEMPORARY_PREFIX}{checkpoint_name(step)}-{os.getpid()}"
    temporary.mkdir()
    try:
        paths, arrays, impls = _plain_leaves(tree)
        arrays_path = temporary / ARRAYS
        with arrays_path.open("wb") as f:
            np.savez(f, **{f"leaf_{i}": array for i, array in enumerate(arrays)})
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "step": step,
            "sha256": _sha256(arrays_path),
            "leaves": [
                {"path": p, "shape": list(a.shape), "dtype": a.dtype.str, "key_impl": k}
                for p, a, k in zip(paths, arrays, impls, strict=True)
            ],
            "metadata": metadata,
        }
        (temporary / MANIFEST).write_text(json.dumps(manifest, indent=1, allow_nan=True))
        for path in (arrays_path, temporary / MANIFEST, temporary):
            _fsync(path)
        aside = None
        if final.exists():  # the same step saved again (e.g. a stop right after a save)
            aside = directory / f"{TEMPORARY_PREFIX}replaced-{final.name}-{os.getpid()}"
            os.rename(final, aside)
        os.rename(temporary, final)
        _fsync(directory)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    for old in complete_checkpoints(directory)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def complete_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint directories (not temporary ones), newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return sorted(found, key=lambda p: int(p.name), reverse=True)


def read_manifest(path: Path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no {MANIFEST}; not a fastpop checkpoint") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path / MANIFEST}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a fastpop checkpoint (format {FORMAT!r} expected)")
    if manifest.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {manifest.get('version')!r}; this fastpop "
            f"reads version {VERSION}"
        )
    return manifest


def restore(path: Path, template: Any, partial: bool = False) -> tuple[Any, dict]:
    """(tree shaped like `template`, metadata) from the checkpoint at `path`.

    Leaves are matched by their path in the tree. With `partial`, the template may name a subset
    of the saved leaves (e.g. only the member states, to evaluate a policy); otherwise the saved
    leaves must be exactly the template's. `template` may also be a function of the metadata,
    for trees whose shape the metadata tells (e.g. how many evaluations were pending).
    """
    path = Path(path)
    manifest = read_manifest(path)
    if callable(template):
        try:
            template = template(manifest["metadata"])
        except CheckpointError as error:  # the metadata does not describe a usable run
            raise CheckpointError(f"{path / MANIFEST}: {error}") from None
    arrays_path = path / ARRAYS
    if not arrays_path.is_file():
        raise CheckpointError(f"{path}: {ARRAYS} is missing")
    if _sha256(arrays_path) != manifest["sha256"]:
        raise CheckpointError(
            f"{arrays_path}: checksum mismatch, the file is truncated or corrupted"
        )
    specs = _leaf_specs(template)
    saved = {entry["path"]: i for i, entry in enumerate(manifest["leaves"])}
    wanted = [p for p, *_ in specs]
    missing = [p for p in wanted if p not in saved]
    extra = [] if partial else sorted(set(saved) - set(wanted))
    if missing or extra:
        problem = f"lacks {missing[0]}" if missing else f"has {extra[0]}, which this run lacks"
        raise CheckpointError(
            f"{path}: the checkpoint {problem} ({len(saved)} arrays saved, this run's state "
            f"has {len(wanted)}); it comes from a different config or fastpop version"
        )
    leaves = []
    try:
        with np.load(arrays_path, allow_pickle=False) as arrays:
            for leaf_path, shape, dtype, impl in specs:
                array = arrays[f"leaf_{saved[leaf_path]}"]
                if array.shape != shape or array.dtype != dtype:
                    raise CheckpointError(
                        f"{path}: {leaf_path} is {array.dtype}{list(array.shape)}, but this "
                        f"run's is {dtype}{list(shape)}; the checkpoint comes from a "
                        "different config"
                    )
                leaves.append(jax.random.wrap_key_data(array, impl=impl) if impl else array)
    except (OSError, ValueError, KeyError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"{arrays_path}: unreadable ({error})") from None
    return jax.tree.unflatten(jax.tree.structure(template), leaves), manifest["metadata"]


def restore_latest(
    directory: Path, template: Any, warn=print, partial: bool = False
) -> tuple[Any, dict, Path]:
    """The newest checkpoint under `directory` that restores (see `restore` for `template` and
    `partial`); each unusable newer one is reported through `warn`. Raises CheckpointError
    when none does."""
    candidates = complete_checkpoints(directory)
    if not candidates:
        raise CheckpointError(f"{directory}: no checkpoint to resume from")
    problems = []
    for path in candidates:
        try:
            tree, metadata = restore(path, template, partial)
        except CheckpointError as error:
            problems.append(str(error))
            warn(f"skipping checkpoint: {error}")
            continue
        return tree, metadata, path
    raise CheckpointError(f"no usable checkpoint in {directory}:\n  " + "\n  ".join(problems))


class CheckpointStore(Protocol):
    """Where a run's checkpoints go: this process's directory (`LocalCheckpoints`) or every
    process's shards (fastpop.distributed.checkpoint_sharded)."""

    def save(self, step: int, tree: Any, metadata: dict) -> Path:
        """Writes one checkpoint; its path."""

    def describe(self, path: Path) -> tuple[dict, str]:
        """(fields for the checkpoint event, what was written, for the log line)."""

    def restore_latest(self, template, warn) -> tuple[Any, dict, Path]:
        """(tree, metadata, path) of the newest checkpoint that reads back whole."""


class LocalCheckpoints:
    """Checkpoints of a run on one process: <run>/checkpoints, the newest `keep` kept."""

    def __init__(self, directory: Path, keep: int):
        self.directory, self.keep = directory, keep

    def save(self, step: int, tree: Any, metadata: dict) -> Path:
        return save(self.directory, step, tree, metadata, self.keep)

    def describe(self, path: Path) -> tuple[dict, str]:
        size = sum(f.stat().st_size for f in path.iterdir())
        return {"bytes": size}, f"{size / 1e6:,.1f} MB"

    def restore_latest(self, template, warn) -> tuple[Any, dict, Path]:
        return restore_latest(self.directory, template, warn)

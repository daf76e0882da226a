"""Checkpoints of a distributed run: every process writes its own shards (orbax).

    <run>/checkpoints/000000123456/arrays/     orbax (OCDBT): each process's shards of the member
                                               states and replay, process 0 the plain arrays
    <run>/checkpoints/000000123456/manifest/   JSON: format, step, topology (processes, devices),
                                               every process's sha256 of its part, metadata

The guarantees are those of `fastpop.run.checkpoint`: orbax writes into a temporary directory that
process 0 renames into place once every process has finished (a directory with a plain step
name is complete; a crash leaves a temporary one, ignored and removed later); each process
hashes the part of the state it holds before the write and again after a restore, so a damaged
shard is noticed by the process that reads it, and all processes then fall back together to the
previous complete checkpoint. A checkpoint made on another topology (process or device count)
is refused: its shards belong to other devices.

Arrays split over processes are saved as they are; everything else (hparams, PRNG keys as their
key data, counters) is the same on every process and saved as numpy by process 0; what differs
by process without being split (the policy snapshots an evaluator has not answered) is stacked on
a leading process axis.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastpop.run.checkpoint import CheckpointError, checkpoint_name

FORMAT = "fastpop-sharded-checkpoint"
VERSION = 1
ARRAYS, MANIFEST = "arrays", "manifest"


def topology() -> dict:
    return {"processes": jax.process_count(), "devices": jax.device_count()}


def _is_key(leaf) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _is_split(leaf) -> bool:
    """Split over processes. A replicated array (a key the update program returns) is not: it is
    saved as numpy, as its template may be before that program first ran."""
    return (
        isinstance(leaf, jax.Array)
        and not leaf.is_fully_addressable
        and not leaf.is_fully_replicated
    )


def _process_sharding() -> NamedSharding:
    """A leading axis of one entry per process, each process's devices holding its own."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    grid = np.array(devices).reshape(jax.process_count(), -1)
    return NamedSharding(jax.sharding.Mesh(grid, ("processes", "local")), P("processes"))


def plain(tree: Any, per_process: tuple[str, ...] = ("pending",), shapes_only=False) -> Any:
    """What orbax writes: split arrays as they are, keys as key data, the rest as numpy; the
    subtrees named in `per_process` stacked on a process axis. `shapes_only`: a restore's
    target, where a replicated array's values are not read (zeros of its shape and dtype: a
    replicated array made in place with one device per process has no readable local shard)."""

    def leaf(value):
        if _is_key(value):
            value = jax.random.key_data(value)
        if _is_split(value):
            return value
        if isinstance(value, jax.Array) and not value.is_fully_addressable:  # replicated
            if shapes_only:
                return np.zeros(value.shape, value.dtype)
            value = value.addressable_shards[0].data
        return np.asarray(value)

    tree = jax.tree.map(leaf, tree)
    sharding = _process_sharding()
    for name in per_process:
        tree[name] = jax.tree.map(
            lambda a: jax.make_array_from_process_local_data(
                sharding, a[None], (jax.process_count(), *a.shape)
            ),
            tree[name],
        )
    return tree


def unplain(restored: Any, template: Any, per_process: tuple[str, ...] = ("pending",)) -> Any:
    """`plain` undone: keys wrapped again as the template's, the process axis taken apart."""
    for name in per_process:
        restored[name] = jax.tree.map(
            lambda a: np.asarray(a.addressable_shards[0].data)[0], restored[name]
        )

    def leaf(value, like):
        if _is_key(like):  # split keys (device-mode env lanes) are wrapped where they are
            data = value if _is_split(value) else np.asarray(value)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(like))
        return value

    return jax.tree.map(leaf, restored, template)


def digest(tree: Any) -> str:
    """sha256 of the part of a `plain` tree this process holds (its shards, in index order)."""
    hasher = hashlib.sha256()
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        hasher.update(jax.tree_util.keystr(path).encode())
        parts = [value] if not isinstance(value, jax.Array) else value.addressable_shards
        for part in sorted(parts, key=lambda s: str(getattr(s, "index", ""))):
            data = np.ascontiguousarray(np.asarray(getattr(part, "data", part)))
            hasher.update(str((data.dtype.str, data.shape)).encode() + data.tobytes())
    return hasher.hexdigest()


def _abstract(tree: Any) -> Any:
    def leaf(value):
        if isinstance(value, jax.Array):
            return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=value.sharding)
        return value

    return jax.tree.map(leaf, tree)


class ShardedCheckpoints:
    """Save and restore a run's checkpoints under `directory`, all processes together."""

    def __init__(self, directory: Path, keep: int, agree):
        import orbax.checkpoint as ocp

        self.ocp, self.agree = ocp, agree  # agree(value) -> every process's value
        name_format = ocp.step.standard_name_format(step_prefix=None, step_format_fixed_length=12)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, step_name_format=name_format, create=True
        )
        self.directory = Path(directory)
        self.manager = ocp.CheckpointManager(
            self.directory.absolute(), options=options, item_names=(ARRAYS, MANIFEST)
        )

    def save(self, step: int, tree: Any, metadata: dict) -> Path:
        ocp = self.ocp
        tree = plain(tree)
        digests = self.agree(digest(tree))
        manifest = {"format": FORMAT, "version": VERSION, "step": step}
        manifest |= {"topology": topology(), "digests": digests, "metadata": metadata}
        args = ocp.args.Composite(
            **{ARRAYS: ocp.args.StandardSave(tree), MANIFEST: ocp.args.JsonSave(manifest)}
        )
        self.manager.save(step, args=args, force=True)
        self.manager.wait_until_finished()
        return self.directory / checkpoint_name(step)

    def manifest(self, step: int) -> dict:
        args = self.ocp.args.Composite(**{MANIFEST: self.ocp.args.JsonRestore()})
        try:
            manifest = self.manager.restore(step, args=args)[MANIFEST]
        except Exception as error:
            raise CheckpointError(f"{self.path(step)}: unreadable manifest ({error})") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(f"{self.path(step)}: not a fastpop sharded checkpoint")
        if manifest.get("topology") != topology():
            raise TopologyChanged(self.path(step), manifest.get("topology"))
        return manifest

    def path(self, step: int) -> Path:
        return self.directory / checkpoint_name(step)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps(), reverse=True)

    def restore(self, step: int, template) -> tuple[Any, dict]:
        """(tree, metadata) of checkpoint `step`; `template(metadata)` gives the tree's
        structure, shapes and shardings (the live state of a run made from the config)."""
        manifest = self.manifest(step)
        live = template(manifest["metadata"])
        target = _abstract(plain(live, shapes_only=True))
        args = self.ocp.args.Composite(**{ARRAYS: self.ocp.args.StandardRestore(target)})
        problem = None
        try:
            restored = self.manager.restore(step, args=args)[ARRAYS]
            if digest(restored) != manifest["digests"][jax.process_index()]:
                problem = "its arrays do not hash as written (damaged)"
        except Exception as error:  # a missing or damaged file of this process's part
            problem = f"unreadable ({str(error).splitlines()[0]})"
        problems = [p for p in self.agree(problem) if p is not None]
        if problems:
            raise CheckpointError(f"{self.path(step)}: {problems[0]}")
        return unplain(restored, live), manifest["metadata"]

    def restore_latest(self, template, warn=print) -> tuple[Any, dict, Path]:
        problems = []
        for step in self.steps():
            try:
                tree, metadata = self.restore(step, template)
            except TopologyChanged:
                raise
            except CheckpointError as error:
                problems.append(str(error))
                warn(f"skipping checkpoint: {error}")
                continue
            return tree, metadata, self.path(step)
        if not problems:
            raise CheckpointError(f"{self.directory}: no checkpoint to resume from")
        raise CheckpointError(
            f"no usable checkpoint in {self.directory}:\n  " + "\n  ".join(problems)
        )

    def close(self) -> None:
        self.manager.close()


class TopologyChanged(CheckpointError):
    def __init__(self, path: Path, saved: dict | None):
        now = topology()
        super().__init__(
            f"{path}: written by {(saved or {}).get('processes')} processes with "
            f"{(saved or {}).get('devices')} devices in all; this run has {now['processes']} "
            f"processes with {now['devices']} devices. Resume it on the topology it was "
            "written on (the same --num-processes and devices per process)"
        )

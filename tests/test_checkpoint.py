"""Checkpoint files: round trips, atomic writes, pruning, and every way a file can be bad."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.run import checkpoint
from fastpop.run.checkpoint import CheckpointError


def tree(scale: float = 1.0):
    return {
        "params": {"w": jnp.full((3, 4), scale, jnp.float32), "b": jnp.arange(4.0) * scale},
        "step": jnp.asarray(7, jnp.int32),
        "flags": np.array([True, False]),
        "key": jax.random.key(3),
        "counts": (np.int64(5), np.zeros((2, 0), np.float32)),
    }


def assert_trees_equal(a, b):
    a_leaves, b_leaves = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(a_leaves, b_leaves, strict=True):
        if checkpoint._is_key(x):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert np.asarray(x).dtype == np.asarray(y).dtype


def test_round_trip_keeps_every_leaf_dtype_and_key(tmp_path):
    path = checkpoint.save(tmp_path, 100, tree(2.0), {"env_steps": 100, "note": "x"})
    restored, metadata = checkpoint.restore(path, tree())
    assert_trees_equal(restored, tree(2.0))
    assert metadata == {"env_steps": 100, "note": "x"}
    # The restored key draws the same numbers as the saved one.
    assert jax.random.uniform(restored["key"]) == jax.random.uniform(jax.random.key(3))


def test_keeps_the_newest_and_ignores_half_written_ones(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save(tmp_path, step, tree(step), {}, keep=2)
    (tmp_path / ".tmp-000000000050-123").mkdir()  # a crash mid-write
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == [
        "000000000040",
        "000000000030",
    ]
    restored, _, path = checkpoint.restore_latest(tmp_path, tree())
    assert path.name == "000000000040"
    assert_trees_equal(restored, tree(40))
    checkpoint.save(tmp_path, 50, tree(50), {}, keep=2)
    assert not list(tmp_path.glob(".tmp-*"))  # cleaned by the next save


def newest_arrays(tmp_path):
    checkpoint.save(tmp_path, 1, tree(1.0), {})
    checkpoint.save(tmp_path, 2, tree(2.0), {})
    return checkpoint.complete_checkpoints(tmp_path)[0] / checkpoint.ARRAYS


def test_truncated_file_is_named_and_resume_falls_back(tmp_path):
    arrays = newest_arrays(tmp_path)
    data = arrays.read_bytes()
    arrays.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"arrays.npz: checksum mismatch.*truncated"):
        checkpoint.restore(arrays.parent, tree())
    warnings = []
    restored, _, path = checkpoint.restore_latest(tmp_path, tree(), warn=warnings.append)
    assert path.name == "000000000001"
    assert_trees_equal(restored, tree(1.0))
    assert len(warnings) == 1 and "000000000002" in warnings[0]


def test_flipped_byte_is_detected(tmp_path):
    arrays = newest_arrays(tmp_path)
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0x01
    arrays.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        checkpoint.restore(arrays.parent, tree())


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: {**m, "format": "something-else"}, "not a fastpop checkpoint"),
        (lambda m: {**m, "version": 99}, "format version 99; this fastpop reads version 2"),
    ],
)
def test_foreign_and_version_mismatched_manifests_are_refused(tmp_path, edit, message):
    path = checkpoint.save(tmp_path, 1, tree(), {})
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    (path / checkpoint.MANIFEST).write_text(json.dumps(edit(manifest)))
    with pytest.raises(CheckpointError, match=message):
        checkpoint.restore(path, tree())


def test_garbled_manifest_and_missing_files(tmp_path):
    path = checkpoint.save(tmp_path, 1, tree(), {})
    (path / checkpoint.MANIFEST).write_text('{"format": "fastpop-chec')
    with pytest.raises(CheckpointError, match=r"manifest\.json: not valid JSON"):
        checkpoint.restore(path, tree())
    (path / checkpoint.MANIFEST).unlink()
    with pytest.raises(CheckpointError, match=r"no manifest\.json"):
        checkpoint.restore(path, tree())
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        checkpoint.restore_latest(tmp_path / "nothing", tree())


def test_a_different_config_is_named_by_its_first_differing_leaf(tmp_path):
    path = checkpoint.save(tmp_path, 1, tree(), {})
    wider = tree()
    wider["params"]["w"] = jnp.zeros((3, 8), jnp.float32)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\] is float32\[3, 4\]"):
        checkpoint.restore(path, wider)
    with pytest.raises(CheckpointError, match="different config"):
        checkpoint.restore(path, {"only": jnp.zeros(3)})


def test_nothing_is_unpickled(tmp_path, monkeypatch):
    path = checkpoint.save(tmp_path, 1, tree(), {})
    seen = []
    original = np.load

    def spy(*args, **kwargs):
        seen.append(kwargs.get("allow_pickle"))
        return original(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    checkpoint.restore(path, tree())
    assert seen == [False]
    # A file holding a pickled object (with a matching checksum) is refused, not loaded.
    arrays = path / checkpoint.ARRAYS
    np.savez(arrays, leaf_0=np.array([{"a": 1}], dtype=object))
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    manifest["sha256"] = checkpoint._sha256(arrays)
    (path / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="unreadable"):
        checkpoint.restore(path, tree())


def test_partial_restore_reads_only_what_the_template_names(tmp_path):
    path = checkpoint.save(tmp_path, 1, {"learner": tree(3.0), "buffers": jnp.ones(5)}, {})
    part, _ = checkpoint.restore(path, {"learner": tree()}, partial=True)
    assert_trees_equal(part["learner"], tree(3.0))
    with pytest.raises(CheckpointError, match=r"has \['buffers'\], which this run lacks"):
        checkpoint.restore(path, {"learner": tree()})
    with pytest.raises(CheckpointError, match=r"lacks \['other'\]"):
        checkpoint.restore(path, {"learner": tree(), "other": jnp.ones(1)}, partial=True)


def test_saving_the_same_step_again_replaces_it(tmp_path):
    checkpoint.save(tmp_path, 5, tree(1.0), {"n": 1})
    checkpoint.save(tmp_path, 5, tree(2.0), {"n": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["000000000005"]
    restored, metadata = checkpoint.restore(tmp_path / "000000000005", tree())
    assert_trees_equal(restored, tree(2.0)) and metadata == {"n": 2}


WRITER = """
import sys, jax.numpy as jnp
from fastpop.run import checkpoint
big = {"w": jnp.zeros((64, 1024, 1024), jnp.uint8)}  # 64 MB: writing takes a while
for step in range(1, 1000):
    checkpoint.save(sys.argv[1], step, {**big, "step": jnp.asarray(step)}, {"step": step}, keep=2)
    print(step, flush=True)
"""


def test_sigkill_while_writing_leaves_the_previous_checkpoint_loadable(tmp_path):
    import subprocess
    import sys
    import time

    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "1"  # one complete checkpoint
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".tmp-*")):  # the next one is being written
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.001)
    finally:
        writer.kill()
        writer.wait()
    template = {"w": jnp.zeros((64, 1024, 1024), jnp.uint8), "step": jnp.asarray(0)}
    restored, metadata, path = checkpoint.restore_latest(tmp_path, template)
    assert metadata["step"] == int(restored["step"]) == int(path.name) >= 1
    checkpoint.save(tmp_path, 10_000, template, {})
    assert not list(tmp_path.glob(".tmp-*"))  # the next save clears the half-written one

"""Shared-memory channels across spawn-started processes: versions, torn reads, ring order, cleanup.

Child process targets live at module level and this module imports no JAX, so spawn children
start quickly.
"""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from fastpop.collect.shm import ChunkRing, Episode, ParamChannel, StopFlag

SPAWN = mp.get_context("spawn")
JOIN_TIMEOUT = 10.0


def _own_segments() -> set[str]:
    return set(glob.glob(f"/dev/shm/fastpop_{os.getpid()}_*"))


@pytest.fixture(autouse=True)
def no_leftover_segments():
    before = _own_segments()
    yield
    assert _own_segments() == before


def _join(process) -> None:
    process.join(JOIN_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join()
        pytest.fail("child process did not finish")
    assert process.exitcode == 0


# --- ParamChannel ---

PARAM_SHAPES = [(4, 3), (5,), ()]


def _params(scale: float) -> list[np.ndarray]:
    rng = np.random.default_rng(int(scale))
    return [(scale * rng.standard_normal(shape)).astype(np.float32) for shape in PARAM_SHAPES]


def _param_reader(spec, conn) -> None:
    with ParamChannel.attach(spec) as channel:
        last = 0
        while conn.recv() == "read":
            got = channel.read_if_newer(last)
            if got is not None:
                last = got[0]
            conn.send(got)


def test_param_channel_versions_reach_a_spawned_reader():
    with ParamChannel.create(_params(1.0)) as channel:
        assert channel.version == 0
        v1, v2 = _params(1.0), _params(2.0)
        assert channel.publish(v1) == 1
        conn, child_conn = SPAWN.Pipe()
        child = SPAWN.Process(target=_param_reader, args=(channel.spec, child_conn))
        child.start()
        try:
            conn.send("read")
            version, leaves = conn.recv()
            assert version == 1
            for got, want in zip(leaves, v1, strict=True):
                np.testing.assert_array_equal(got, want)
                assert got.dtype == np.float32
            conn.send("read")
            assert conn.recv() is None  # nothing newer than v1
            assert channel.publish(v2) == 2
            conn.send("read")
            version, leaves = conn.recv()
            assert version == 2
            for got, want in zip(leaves, v2, strict=True):
                np.testing.assert_array_equal(got, want)
            conn.send("read")
            assert conn.recv() is None  # read_if_newer(2)
        finally:
            conn.send("stop")
            _join(child)
        assert channel.read_if_newer(2) is None
        assert channel.read_if_newer(1)[0] == 2


def test_a_reader_copies_only_its_rows_of_each_stacked_leaf_and_scalars_whole():
    leaves = [np.arange(12.0).reshape(4, 3), np.arange(4, dtype=np.int32), np.float32(7.0)]
    with ParamChannel.create(leaves) as channel:
        channel.publish(leaves)
        version, got = channel.read_if_newer(0, rows=slice(1, 3))
        assert version == 1
        np.testing.assert_array_equal(got[0], leaves[0][1:3])
        np.testing.assert_array_equal(got[1], [1, 2])
        assert got[2].shape == () and got[2] == 7.0
        got[0][:] = -1  # a copy: the channel keeps what was published
        np.testing.assert_array_equal(channel.read_if_newer(0)[1][0], leaves[0])


TORN_SHAPES = [(64, 1024), (1024,), (32, 512)]


def _alternating_writer(spec, stop_spec) -> None:
    leaves = {value: [np.full(s, value, np.float32) for s in TORN_SHAPES] for value in (0, 1)}
    with ParamChannel.attach(spec) as channel, StopFlag.attach(stop_spec) as stop:
        value, published = 0, 0
        while not stop.is_set():
            channel.publish(leaves[value])
            value = 1 - value
            published += 1
            if published % 51 == 0:  # odd: pauses land after 0s and after 1s alike
                # Back to back publishes race every read; a rare pause keeps a reader on a
                # loaded machine from starving (the learner publishes far less often).
                time.sleep(1e-3)


def test_param_channel_never_returns_a_torn_copy():
    zeros = [np.zeros(s, np.float32) for s in TORN_SHAPES]
    with ParamChannel.create(zeros) as channel, StopFlag.create() as stop:
        writer = SPAWN.Process(target=_alternating_writer, args=(channel.spec, stop.spec))
        writer.start()
        try:
            deadline = time.monotonic() + 10.0
            while channel.version < 10 and time.monotonic() < deadline:
                time.sleep(0.01)
            # Many reads overlap a write and retry; stop after enough consistent ones.
            last, reads, seen = 0, 0, set()
            end = time.monotonic() + 5.0
            while reads < 50 and time.monotonic() < end:
                got = channel.read_if_newer(last)
                if got is None:
                    continue
                version, leaves = got
                assert version > last
                values = {float(x) for leaf in leaves for x in np.unique(leaf)}
                assert len(values) == 1, f"torn read at version {version}: {values}"
                last, reads = version, reads + 1
                seen |= values
        finally:
            stop.set()
            _join(writer)
        assert reads >= 5 and seen == {0.0, 1.0}


def test_param_channel_rejects_bad_leaves_and_times_out_on_a_dead_writer():
    with ParamChannel.create([((3,), np.float32)]) as channel:
        with pytest.raises(ValueError, match="leaves"):
            channel.publish([])
        with pytest.raises(ValueError, match="shape"):
            channel.publish([np.zeros(4, np.float32)])
        assert channel.version == 0  # a rejected publish writes nothing
        channel._counter[0] += 1  # as if the writer died mid-publish
        with pytest.raises(TimeoutError, match="died"):
            channel.read_if_newer(0, timeout=0.05)


# --- ChunkRing ---

LANES, CHUNK_LEN, OBS_DIM, ACTION_DIM = 2, 5, 3, 2
ROW_FIELDS = {
    "obs": ((LANES, CHUNK_LEN, OBS_DIM), np.float32),
    "action": ((LANES, CHUNK_LEN, ACTION_DIM), np.float32),
    "reward": ((LANES, CHUNK_LEN), np.float32),
    "terminated": ((LANES, CHUNK_LEN), bool),
    "truncated": ((LANES, CHUNK_LEN), bool),
    "autoreset": ((LANES, CHUNK_LEN), bool),
    "episode_start": ((LANES, CHUNK_LEN), bool),
}
MAX_EPISODES = 3


def _chunk(seq: int) -> tuple[dict[str, np.ndarray], list[tuple[int, float, int]]]:
    arrays = {}
    for name, (shape, dtype) in ROW_FIELDS.items():
        if dtype is bool:
            arrays[name] = (np.arange(np.prod(shape)).reshape(shape) + seq) % 3 == 0
        else:
            arrays[name] = np.full(shape, seq, dtype) + np.arange(shape[-1], dtype=dtype)
    episodes = [(seq % 4 + i, 0.5 * seq - i, seq + i) for i in range(seq % (MAX_EPISODES + 1))]
    return arrays, episodes


def try_put(ring: ChunkRing, arrays: dict, episodes=()) -> bool:
    """Publishes one chunk without waiting; False (nothing written) when the ring is full."""
    return ring.put(arrays, episodes, timeout=0)


def drain(ring: ChunkRing, max_chunks: int | None = None) -> list:
    """Up to `max_chunks` (all when None) available chunks, oldest first, without waiting."""
    chunks = []
    while max_chunks is None or len(chunks) < max_chunks:
        chunk = ring.try_get()
        if chunk is None:
            break
        chunks.append(chunk)
    return chunks


def _producer(spec, num_chunks, stop_spec) -> None:
    with ChunkRing.attach(spec) as ring, StopFlag.attach(stop_spec) as stop:
        for seq in range(num_chunks):
            assert ring.put(*_chunk(seq), stop_event=stop, timeout=JOIN_TIMEOUT)


def _check_chunk(chunk, seq: int) -> None:
    arrays, episodes = _chunk(seq)
    assert chunk.seq == seq
    assert chunk.episodes == [Episode(*e) for e in episodes]
    assert sorted(chunk.arrays) == sorted(arrays)
    for name, want in arrays.items():
        assert chunk.arrays[name].dtype == want.dtype
        np.testing.assert_array_equal(chunk.arrays[name], want, err_msg=name)


def test_chunk_ring_delivers_chunks_complete_and_in_order_across_processes():
    num_chunks = 40
    ring = ChunkRing.create(ROW_FIELDS, num_slots=3, max_episodes_per_chunk=MAX_EPISODES)
    with ring, StopFlag.create() as stop:
        child = SPAWN.Process(target=_producer, args=(ring.spec, num_chunks, stop.spec))
        child.start()
        received = []
        try:
            deadline = time.monotonic() + JOIN_TIMEOUT
            while len(received) < num_chunks and time.monotonic() < deadline:
                chunks = drain(ring, max_chunks=2)
                assert len(chunks) <= 2
                received += chunks
                if not chunks:
                    time.sleep(0.001)
        finally:
            stop.set()
            _join(child)
        assert [c.seq for c in received] == list(range(num_chunks))
        for seq, chunk in enumerate(received):
            _check_chunk(chunk, seq)
        assert ring.try_get() is None


def _blocked_producer(spec, stop_spec, conn) -> None:
    with ChunkRing.attach(spec) as ring, StopFlag.attach(stop_spec) as stop:
        while try_put(ring, *_chunk(0)):
            pass
        conn.send("full")
        conn.send(ring.put(*_chunk(1), stop_event=stop, timeout=JOIN_TIMEOUT))


def test_a_stop_flag_set_by_the_owner_releases_a_producer_waiting_on_a_full_ring():
    ring = ChunkRing.create(ROW_FIELDS, num_slots=2, max_episodes_per_chunk=MAX_EPISODES)
    with ring, StopFlag.create() as stop:
        conn, child_conn = SPAWN.Pipe()
        child = SPAWN.Process(target=_blocked_producer, args=(ring.spec, stop.spec, child_conn))
        child.start()
        try:
            assert conn.poll(JOIN_TIMEOUT) and conn.recv() == "full"
            assert not stop.is_set()
            stop.set()
            assert conn.poll(JOIN_TIMEOUT), "the producer did not notice the stop flag"
            assert conn.recv() is False  # gave up without writing
        finally:
            _join(child)
        assert len(ring) == 2


def test_chunk_ring_reports_full_and_validates_chunks():
    likes = {name: np.zeros(shape, dtype) for name, (shape, dtype) in ROW_FIELDS.items()}
    with ChunkRing.create(likes, num_slots=2, max_episodes_per_chunk=MAX_EPISODES) as ring:
        assert try_put(ring, *_chunk(0)) and try_put(ring, *_chunk(1))
        assert not try_put(ring, *_chunk(2))
        assert not ring.put(*_chunk(2), timeout=0.01)
        assert len(ring) == 2
        _check_chunk(ring.try_get(), 0)
        assert try_put(ring, *_chunk(2))
        for seq, chunk in enumerate(drain(ring), start=1):
            _check_chunk(chunk, seq)
        arrays, _ = _chunk(3)
        with pytest.raises(ValueError, match="max_episodes_per_chunk"):
            try_put(ring, arrays, [(0, 0.0, 1)] * (MAX_EPISODES + 1))
        with pytest.raises(ValueError, match="fields"):
            try_put(ring, {k: v for k, v in arrays.items() if k != "obs"})
        with pytest.raises(ValueError, match="'reward'"):
            try_put(ring, {**arrays, "reward": np.zeros((LANES, CHUNK_LEN + 1), np.float32)})
        assert len(ring) == 0


def test_chunks_the_producer_withdraws_are_passed_over_and_only_their_episodes_arrive():
    """A producer's `skip_queued`: the consumer passes over every chunk queued then and the one
    being written, and hands their finished episodes over with the next chunk it returns."""
    likes = {name: np.zeros(shape, dtype) for name, (shape, dtype) in ROW_FIELDS.items()}
    with ChunkRing.create(likes, num_slots=4, max_episodes_per_chunk=MAX_EPISODES) as ring:
        assert all(try_put(ring, *_chunk(seq)) for seq in range(3))
        _check_chunk(ring.try_get(), 0)
        ring.skip_queued()  # chunks 1 and 2 queued, 3 being written
        assert ring.skip_below == 4 and try_put(ring, *_chunk(3))
        assert ring.try_get() is None and len(ring) == 0  # all passed over: the room is free
        assert try_put(ring, *_chunk(4)) and try_put(ring, *_chunk(5))
        chunk = ring.try_get()
        arrays, episodes = _chunk(4)
        carried = [Episode(*e) for seq in (1, 2, 3) for e in _chunk(seq)[1]]
        assert chunk.seq == 4 and chunk.episodes == carried + [Episode(*e) for e in episodes]
        for name, want in arrays.items():
            np.testing.assert_array_equal(chunk.arrays[name], want, err_msg=name)
        _check_chunk(ring.try_get(), 5)  # nothing carried twice
        ring.skip_queued(including_next=False)
        assert ring.skip_below == 6 and try_put(ring, *_chunk(6))
        _check_chunk(ring.try_get(), 6)


# --- lifecycle ---


def test_close_and_unlink_leave_no_segments_and_unlink_is_idempotent():
    channel = ParamChannel.create([((2,), np.float32)])
    ring = ChunkRing.create(ROW_FIELDS, num_slots=2, max_episodes_per_chunk=1)
    paths = {f"/dev/shm/{channel.name}", f"/dev/shm/{ring.name}"}
    assert all(os.path.basename(p).startswith(f"fastpop_{os.getpid()}_") for p in paths)
    assert paths <= _own_segments()
    attached = ParamChannel.attach(channel.spec)
    with pytest.raises(RuntimeError, match="only the creating process"):
        attached.unlink()
    attached.close()
    attached.close()
    for owner in (channel, ring):
        owner.close()
        owner.unlink()
        owner.unlink()
    assert not paths & _own_segments()


_LIFECYCLE_SCRIPT = """
import multiprocessing as mp, os, subprocess, sys
import numpy as np
from fastpop.collect.shm import ChunkRing, ParamChannel

def attach_and_exit(spec):
    ParamChannel.attach(spec).close()

if __name__ == "__main__":
    with ParamChannel.create([np.zeros(3, np.float32)]) as channel:
        channel.publish([np.ones(3, np.float32)])
        # An independently started process (its own resource tracker) attaches and exits.
        code = "from fastpop.collect.shm import ArrayLayout, ParamChannel, ParamSpec; "
        code += f"ParamChannel.attach({channel.spec!r}).close()"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert os.path.exists(f"/dev/shm/{channel.name}"), "an attacher's exit removed the segment"
        # Two spawn children (sharing this process's resource tracker) attach and exit.
        for _ in range(2):
            child = mp.get_context("spawn").Process(target=attach_and_exit, args=(channel.spec,))
            child.start()
            child.join()
            assert child.exitcode == 0
        assert channel.read_if_newer(0)[0] == 1
    print("done")
"""


def test_attaching_processes_neither_unlink_nor_make_the_resource_tracker_warn(tmp_path):
    script = tmp_path / "lifecycle.py"
    script.write_text(textwrap.dedent(_LIFECYCLE_SCRIPT))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    # The resource tracker reports leaks and bad unregisters on stderr.
    assert result.stderr == "", result.stderr

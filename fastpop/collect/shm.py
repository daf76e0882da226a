"""Shared-memory channels between the learner and its worker processes; data is never pickled.

`ParamChannel` (learner -> collectors) holds one set of parameter leaves plus a version counter,
guarded by a seqlock. `ChunkRing` (one collector -> the learner) is a single-producer
single-consumer ring of fixed-size chunk slots. `StopFlag` (learner -> every worker) asks them to
stop. All live in `multiprocessing.shared_memory` segments (`segments`: names, ownership,
orphan reclaim); the process that creates a segment owns it and unlinks it, other processes
`attach(spec)` and only `close()`. Only the small layout spec (plain tuples, strings and ints)
crosses a process boundary by pickling; data goes through numpy views.

Memory ordering: the counters are aligned int64 stores and loads done by numpy, and CPython
performs them in program order (each is its own C call, so the C compiler cannot reorder them
across the data copies either). On x86 (total store order) stores become visible in program
order and loads are not reordered with other loads, which is all the seqlock and the ring rely
on. Weakly ordered CPUs (ARM) would need fences that Python does not expose, so creating or
attaching a segment there raises `segments.WeakMemoryOrderError` instead of racing silently.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from multiprocessing.shared_memory import SharedMemory
from typing import NamedTuple

import numpy as np

from fastpop.collect.segments import Segment

_ALIGN = 64  # a cache line: counters written by different processes never share one
_EPISODE_DTYPE = np.dtype([("member", "<i8"), ("episode_return", "<f8"), ("length", "<i8")])


class ArrayLayout(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype string, e.g. "<f4"
    offset: int  # bytes from the start of the segment (params) or of the slot (ring)


class ParamSpec(NamedTuple):
    segment: str
    size: int
    leaves: tuple[ArrayLayout, ...]


class ChunkRingSpec(NamedTuple):
    segment: str
    size: int
    num_slots: int
    slot_bytes: int
    max_episodes_per_chunk: int
    fields: tuple[ArrayLayout, ...]


class Episode(NamedTuple):
    member: int
    episode_return: float
    length: int


class Chunk(NamedTuple):
    seq: int
    arrays: dict[str, np.ndarray]  # copies, owned by the caller
    episodes: list[Episode]


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _layout(named: Sequence[tuple[str, object]], start: int) -> tuple[tuple[ArrayLayout, ...], int]:
    """Aligned layouts for (name, array-like or (shape, dtype)) pairs; returns them and the end."""
    out, offset = [], start
    for name, like in named:
        shape, dtype = (like.shape, like.dtype) if hasattr(like, "shape") else like
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        out.append(ArrayLayout(name, shape, dtype.str, offset))
        offset = _round_up(offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
    return tuple(out), offset


def _view(shm: SharedMemory, layout: ArrayLayout, base: int = 0) -> np.ndarray:
    return np.ndarray(layout.shape, np.dtype(layout.dtype), shm.buf, base + layout.offset)


def _check_source(layout: ArrayLayout, value, what: str) -> np.ndarray:
    """Validates before any byte is written, so a bad input never leaves a half-written slot."""
    array = np.asarray(value)
    if array.shape != layout.shape or not np.can_cast(array.dtype, layout.dtype, "same_kind"):
        raise ValueError(
            f"{what}: got shape {array.shape} dtype {array.dtype}, the channel holds shape "
            f"{layout.shape} dtype {np.dtype(layout.dtype)}"
        )
    return array


class ParamChannel(Segment):
    """One writer publishes a flat list of leaves; any number of readers copy the newest version.

    Leaves are a flat list, not a pytree, so this module needs no JAX: the learner publishes
    `jax.tree_util.tree_leaves(params)` and a collector rebuilds the tree with its own treedef
    (from the same agent factory), `jax.tree_util.tree_unflatten(treedef, leaves)`.

    Seqlock: the header's int64 counter is odd while a publish is writing and even when stable;
    version = counter // 2, so version 0 means nothing published yet. Single writer only.
    """

    def __init__(self, spec: ParamSpec, shm: SharedMemory, owner: bool):
        super().__init__(shm, owner)
        self.spec = spec
        self._counter = np.ndarray((1,), np.int64, shm.buf, 0)
        self._leaves = [_view(shm, layout) for layout in spec.leaves]

    @classmethod
    def create(cls, leaves_like: Sequence) -> ParamChannel:
        """`leaves_like`: arrays or (shape, dtype) pairs, e.g. the leaves of the actor params."""
        layouts, size = _layout([(str(i), x) for i, x in enumerate(leaves_like)], _ALIGN)
        shm = cls._create_segment(size)
        return cls(ParamSpec(shm.name, size, layouts), shm, owner=True)

    @classmethod
    def attach(cls, spec: ParamSpec) -> ParamChannel:
        return cls(spec, cls._attach_segment(spec.segment), owner=False)

    def _drop_views(self) -> None:
        self._counter, self._leaves = None, []

    @property
    def version(self) -> int:
        """The newest complete or in-progress version (a peek; no copy)."""
        return (int(self._counter[0]) + 1) // 2

    def publish(self, leaves: Sequence) -> int:
        """Writes all leaves (numpy or jax arrays) and returns the new version."""
        if len(leaves) != len(self.spec.leaves):
            raise ValueError(
                f"publish: got {len(leaves)} leaves, the channel holds {len(self.spec.leaves)}"
            )
        sources = [
            _check_source(layout, leaf, f"publish: leaf {layout.name}")
            for layout, leaf in zip(self.spec.leaves, leaves, strict=True)
        ]
        counter = int(self._counter[0])
        self._counter[0] = counter + 1  # odd: readers that overlap this write will retry
        for view, source in zip(self._leaves, sources, strict=True):
            np.copyto(view, source, casting="same_kind")
        self._counter[0] = counter + 2
        return (counter + 2) // 2

    def read_if_newer(
        self, last_version: int, timeout: float = 5.0, rows: slice | None = None
    ) -> tuple[int, list[np.ndarray]] | None:
        """(version, copies of the leaves) if a version newer than `last_version` is published.
        `rows`: of every leaf with a leading axis, only these rows are copied (a collector's own
        members of the stacked policy; scalars whole): 80 members' actors are 23 MB, which every
        collector would otherwise copy at every publish.

        Retries while a publish overlaps the copy; raises TimeoutError if no consistent copy
        could be taken within `timeout` seconds (the writer died mid-publish).
        """
        rows = slice(None) if rows is None else rows
        deadline = time.monotonic() + timeout
        while True:
            start = int(self._counter[0])
            if start % 2 == 0:
                if start // 2 <= last_version:
                    return None
                copies = [(view[rows] if view.ndim else view).copy() for view in self._leaves]
                if int(self._counter[0]) == start:
                    return start // 2, copies
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"parameter channel {self.name}: no consistent read within {timeout} s; "
                    "the publishing process may have died while writing"
                )
            time.sleep(0)  # yield so a writer sharing this core can finish


class ChunkRing(Segment):
    """Single-producer single-consumer ring of `num_slots` fixed-size chunks.

    Header: head (chunks published) and tail (chunks consumed) as int64 on separate cache
    lines; chunk `seq` lives in slot `seq % num_slots`. The producer writes a slot fully before
    advancing head; the consumer copies a slot out before advancing tail, so neither ever sees
    a partial chunk and chunks arrive in order with increasing sequence numbers from 0.

    The producer may withdraw what it queued (`skip_queued`): on head's cache line it writes a
    sequence number below which the consumer passes chunks over, keeping only their finished
    episodes (handed over with the next chunk it returns). A collector does so when its members'
    rows in the ring went stale (a fresh trial started), so that the new rows are not queued
    behind them.
    """

    _HEAD, _SKIP_BELOW, _TAIL = 0, 1, _ALIGN // 8  # int64 indices into the header

    def __init__(self, spec: ChunkRingSpec, shm: SharedMemory, owner: bool):
        super().__init__(shm, owner)
        self.spec = spec
        self._header = np.ndarray((2 * _ALIGN // 8,), np.int64, shm.buf, 0)
        self._skipped_episodes: list[Episode] = []  # the consumer's, of chunks passed over
        self._slots = [
            self._slot_views(2 * _ALIGN + i * spec.slot_bytes) for i in range(spec.num_slots)
        ]

    def _slot_views(self, base: int):
        """(seq and episode count, episode records, field arrays) of the slot at byte `base`."""
        buf, episodes = self._shm.buf, self.spec.max_episodes_per_chunk
        meta = np.ndarray((2,), np.int64, buf, base)
        records = np.ndarray((episodes,), _EPISODE_DTYPE, buf, base + _ALIGN)
        fields = {layout.name: _view(self._shm, layout, base) for layout in self.spec.fields}
        return meta, records, fields

    @classmethod
    def create(
        cls, fields: Mapping[str, object], num_slots: int, max_episodes_per_chunk: int
    ) -> ChunkRing:
        """`fields`: name -> array or (shape, dtype), e.g. a `replay.Rows(...)._asdict()`."""
        if num_slots < 1 or max_episodes_per_chunk < 0:
            raise ValueError(
                f"chunk ring needs num_slots >= 1 and max_episodes_per_chunk >= 0, "
                f"got {num_slots} and {max_episodes_per_chunk}"
            )
        episodes_end = _round_up(_ALIGN + max_episodes_per_chunk * _EPISODE_DTYPE.itemsize)
        layouts, slot_bytes = _layout(list(fields.items()), episodes_end)
        size = 2 * _ALIGN + num_slots * slot_bytes
        shm = cls._create_segment(size)
        spec = ChunkRingSpec(shm.name, size, num_slots, slot_bytes, max_episodes_per_chunk, layouts)
        return cls(spec, shm, owner=True)

    @classmethod
    def attach(cls, spec: ChunkRingSpec) -> ChunkRing:
        return cls(spec, cls._attach_segment(spec.segment), owner=False)

    def _drop_views(self) -> None:
        self._header, self._slots = None, []

    def __len__(self) -> int:
        """Chunks published and not yet consumed."""
        return int(self._header[self._HEAD]) - int(self._header[self._TAIL])

    def _check(self, arrays: Mapping, episodes: Sequence) -> list[np.ndarray]:
        names = [layout.name for layout in self.spec.fields]
        if sorted(arrays) != sorted(names):
            raise ValueError(
                f"chunk fields {sorted(arrays)} differ from the ring's {sorted(names)}"
            )
        if len(episodes) > self.spec.max_episodes_per_chunk:
            raise ValueError(
                f"chunk has {len(episodes)} finished episodes, more than "
                f"max_episodes_per_chunk={self.spec.max_episodes_per_chunk}"
            )
        return [
            _check_source(lay, arrays[lay.name], f"chunk field {lay.name!r}")
            for lay in self.spec.fields
        ]

    def _write(self, sources: list[np.ndarray], episodes: Sequence) -> bool:
        head = int(self._header[self._HEAD])
        if head - int(self._header[self._TAIL]) >= self.spec.num_slots:
            return False
        meta, episode_records, views = self._slots[head % self.spec.num_slots]
        for view, source in zip(views.values(), sources, strict=True):
            np.copyto(view, source, casting="same_kind")
        episode_records[: len(episodes)] = [tuple(episode) for episode in episodes]
        meta[0], meta[1] = head, len(episodes)
        self._header[self._HEAD] = head + 1  # publish only after the slot is complete
        return True

    def put(
        self,
        arrays: Mapping[str, np.ndarray],
        episodes: Sequence = (),
        *,
        stop_event=None,
        timeout: float | None = None,
        poll_interval: float = 1e-3,
    ) -> bool:
        """Publishes one chunk, waiting while the ring is full; False (nothing written) if
        `stop_event` is set or `timeout` passes first.

        `episodes`: (member, episode_return, length) of episodes that finished in this chunk.
        """
        sources = self._check(arrays, episodes)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._write(sources, episodes):
            stopped = stop_event is not None and stop_event.is_set()
            if stopped or (deadline is not None and time.monotonic() > deadline):
                return False
            time.sleep(poll_interval)
        return True

    @property
    def skip_below(self) -> int:
        """The sequence number below which the consumer passes chunks over (0: none)."""
        return int(self._header[self._SKIP_BELOW])

    def skip_queued(self, including_next: bool = True) -> None:
        """Producer: the consumer passes over every chunk published so far and not yet taken,
        and the one being written now too (`including_next`; its rows are as stale)."""
        skip_below = int(self._header[self._HEAD]) + int(including_next)
        self._header[self._SKIP_BELOW] = max(skip_below, self.skip_below)

    def _slot(self, tail: int):
        meta, episode_records, views = self._slots[tail % self.spec.num_slots]
        seq, count = int(meta[0]), int(meta[1])
        if seq != tail:
            raise RuntimeError(
                f"chunk ring {self.name}: slot holds chunk {seq}, expected {tail} "
                "(more than one producer or consumer?)"
            )
        episodes = [
            Episode(int(r["member"]), float(r["episode_return"]), int(r["length"]))
            for r in episode_records[:count]
        ]
        return seq, episodes, views

    def try_get(self) -> Chunk | None:
        """The oldest unconsumed chunk not skipped (copied out of shared memory), or None when
        there is none; it carries the finished episodes of the chunks skipped before it."""
        while True:
            tail = int(self._header[self._TAIL])
            if int(self._header[self._HEAD]) == tail:
                return None
            seq, episodes, views = self._slot(tail)
            if tail < self.skip_below:
                self._skipped_episodes += episodes
                self._header[self._TAIL] = tail + 1
                continue
            arrays = {name: view.copy() for name, view in views.items()}
            self._header[self._TAIL] = tail + 1  # only now may the producer reuse the slot
            episodes, self._skipped_episodes = self._skipped_episodes + episodes, []
            return Chunk(seq, arrays, episodes)


class StopFlag(Segment):
    """Set by the learner, read by every worker: a stop request in shared memory.

    In place of a `multiprocessing.Event`, whose named semaphores outlive a run killed as a
    whole (learner, workers and resource tracker at once) in /dev/shm, where nothing removes
    them. A segment is reclaimed by the next run (`segments.reclaim_orphaned_segments`).
    """

    def __init__(self, spec: str, shm: SharedMemory, owner: bool):
        super().__init__(shm, owner)
        self.spec = spec  # the segment's name
        self._flag = np.ndarray((1,), np.int64, shm.buf, 0)

    @classmethod
    def create(cls) -> StopFlag:
        shm = cls._create_segment(_ALIGN)
        return cls(shm.name, shm, owner=True)

    @classmethod
    def attach(cls, spec: str) -> StopFlag:
        return cls(spec, cls._attach_segment(spec), owner=False)

    def _drop_views(self) -> None:
        self._flag = None

    def set(self) -> None:
        self._flag[0] = 1

    def is_set(self) -> bool:
        return bool(self._flag[0])

"""The shared memory between the learner and its worker processes (fastpop.collect.workers):
the stop flag, the policies' channel, one chunk ring per collector and the evaluator's snapshot
ring (fastpop.collect.shm)."""

from __future__ import annotations

import numpy as np

from fastpop.collect import snapshot
from fastpop.collect.collector import TRIAL_FIELD, max_episodes_per_chunk
from fastpop.collect.shm import ChunkRing, ParamChannel, StopFlag
from fastpop.population import replay

EVAL_SLOTS = 4


def ring_fields(replay_spec: replay.ReplaySpec, num_slots: int) -> dict:
    """A collector's chunk of `num_slots` env slots: its rows, and the trial each slot's rows
    are for."""
    rows = replay.row_layout(replay_spec, (num_slots, replay_spec.chunk_len))._asdict()
    fields = {name: (layout.shape, layout.dtype) for name, layout in rows.items()}
    return fields | {TRIAL_FIELD: ((num_slots,), np.int32)}


class WorkerChannels:
    """Every segment the workers share with the learner. `create` makes them inside the
    workers' cleanup scope, and `close` unlinks whichever exist, so that an interruption half
    way through `create` leaves none behind."""

    def __init__(self, replay_spec: replay.ReplaySpec, blocks: list[tuple[int, int]], slots: int):
        """`blocks`: each collector's (first_slot, num_slots); `slots`: chunks per ring."""
        self.ring_layouts = [
            (ring_fields(replay_spec, count), max_episodes_per_chunk(count, replay_spec.chunk_len))
            for _, count in blocks
        ]
        self.ring_slots = slots
        self.stop_flag: StopFlag | None = None
        self.params: ParamChannel | None = None
        self.rings: list[ChunkRing] = []
        self.eval_ring: ChunkRing | None = None

    def create(self, policy_leaves: list) -> None:
        """The segments, for policies of `policy_leaves`' layout."""
        self.stop_flag = StopFlag.create()
        self.params = ParamChannel.create(policy_leaves)
        for fields, max_episodes in self.ring_layouts:
            self.rings.append(ChunkRing.create(fields, self.ring_slots, max_episodes))
        self.eval_ring = ChunkRing.create(snapshot.layout(policy_leaves), EVAL_SLOTS, 0)

    def close(self) -> None:
        for channel in (self.params, self.eval_ring, *self.rings, self.stop_flag):
            if channel is not None:
                channel.close()
                channel.unlink()

"""The learner's host-side counters, in one object both collection modes go through.

    begin_chunk(lane_epochs) -> ChunkStart   a chunk of rows goes in: the rate limiter counts
                                             it, the trial clocks start where own rows begin
    end_calls(calls, metrics)                update calls made: counted, the limiter's samples,
                                             a new policy version

Process mode calls them around `ReplayStore.insert` and each `Learner.update`; device mode once
per chunk, before and after its programs (`Learner.begin_device_chunk` / `end_device_chunk`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fastpop.learn.member_clocks import MemberClocks
from fastpop.learn.rate_limiter import RateLimiter
from fastpop.learn.update_calls import UpdateCalls


class ChunkStart(NamedTuple):
    """What `begin_chunk` fixed, read before the chunk went in."""

    env_steps: np.ndarray  # (P,) int32: each member's trial's env steps before the chunk
    restarts: np.ndarray  # (P,) bool: members whose fresh trial starts with these rows
    stale: np.ndarray  # (P,) bool: members whose rows in the chunk belong to a stopped trial
    # (to take out of their buffers again)


class Bookkeeping:
    """Rate limiter, trial clocks, update calls and policy version of one learner (all plain
    numbers, saved in checkpoints by the learner)."""

    def __init__(self, size: int, limiter: RateLimiter, calls: UpdateCalls):
        self.limiter, self.calls = limiter, calls
        self.clocks = MemberClocks(size)  # versions and trials (learn/member_clocks.py)
        # Counts changes of the acting policies (updates, selections, restores): a collection
        # whose workers act with copies sends them new ones when it differs from what it sent.
        self.policy_version = 0

    def begin_chunk(self, lane_epochs: np.ndarray | None = None) -> ChunkStart:
        """A chunk of rows goes in. `lane_epochs`: per lane, the trial its collector acted for
        (None: rows made for the current trials, as device mode makes them)."""
        limiter, clocks = self.limiter, self.clocks
        env_steps = clocks.trial_steps(limiter.inserted).astype(np.int32)
        restarts = clocks.restarting()
        own = clocks.own_rows(lane_epochs)
        before = limiter.inserted
        limiter.record_insert()
        return ChunkStart(env_steps, restarts, clocks.record_rows(own, before))

    def calls_due(self, lanes_per_member: int) -> int:
        """Device mode: the update calls the rows in so far allow (`InProgramLimiter`), none
        before every lane holds a transition (two rows)."""
        limiter = self.limiter
        rows_per_lane = (limiter.inserted - limiter.refill_from) // lanes_per_member
        return limiter.calls_due() if rows_per_lane >= 2 else 0

    def end_calls(self, calls: int, metrics) -> None:
        """`calls` update calls were made (`metrics`: the last one's)."""
        self.limiter.record_calls(calls)
        self.calls.record(calls, metrics)
        if calls:
            self.policy_version += 1

    def policies_changed(self, members: np.ndarray | None = None) -> None:
        """A strategy step or a selection changed the policies (`members`: which, for their
        versions; None: none counted)."""
        self.policy_version += 1
        if members is not None:
            self.clocks.changed(members)

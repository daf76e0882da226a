"""The evaluation snapshot: what the learner hands the evaluator for one evaluation round.

Plain arrays, so it crosses a `ChunkRing` and goes into a checkpoint as it is: the policy leaves
(`Learner.policy_leaves`: stacked policy params, hparams, env steps per member) as `leaf_<i>`,
and one float64 row of metadata. Every writer and reader of the format goes through here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

META_FIELD = "snapshot_meta"


class SnapshotMeta(NamedTuple):
    """Where the run was when the snapshot was taken."""

    eval_index: int
    env_steps: int  # over all members
    updates: int  # per member
    wall_time: float  # seconds since the run started


def _leaf_name(index: int) -> str:
    return f"leaf_{index}"


def encode(leaves: Sequence[np.ndarray], meta: SnapshotMeta) -> dict[str, np.ndarray]:
    arrays = {_leaf_name(i): np.asarray(leaf) for i, leaf in enumerate(leaves)}
    arrays[META_FIELD] = np.array(meta, np.float64)
    return arrays


def decode(arrays: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], SnapshotMeta]:
    """(policy leaves in order, metadata) of an `encode`d snapshot."""
    meta = np.asarray(arrays[META_FIELD], np.float64)
    leaves = [arrays[_leaf_name(i)] for i in range(len(arrays) - 1)]
    eval_index, env_steps, updates, wall_time = meta.tolist()
    return leaves, SnapshotMeta(int(eval_index), int(env_steps), int(updates), wall_time)


def layout(leaves: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """A zero snapshot shaped like one of `leaves` (ring layouts, checkpoint templates)."""
    return encode([np.zeros_like(leaf) for leaf in leaves], SnapshotMeta(0, 0, 0, 0.0))

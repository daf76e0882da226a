"""Host side of collection: turn vector-env steps into replay rows and finished episodes (the
envs themselves are stepped by `lockstep_envs.py`).

Under gymnasium's next-step autoreset every env step yields exactly one row per env: the step
after an episode ends is the reset step (its obs is the final observation, its action ignored).
So all lanes advance in lockstep and chunks have a fixed size.

Nothing here imports JAX at module level: a collector process records its warm-up's rows with
this module before it has imported JAX (`RowLayout` is what it is sent of the replay spec).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fastpop.types import stored_obs

if TYPE_CHECKING:
    from fastpop.population import replay


class RowLayout(NamedTuple):
    """What `RowStream` reads of a `replay.ReplaySpec`, as plain data: a collector is sent this,
    not the spec, so unpickling it imports no JAX."""

    chunk_len: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_dtype: np.dtype
    frame_stack: int

    @classmethod
    def of(cls, spec: replay.ReplaySpec) -> RowLayout:
        dtypes = np.dtype(spec.obs_dtype), np.dtype(spec.action_dtype)
        return cls(int(spec.chunk_len), tuple(spec.obs_shape), *dtypes, int(spec.frame_stack))


# `replay.Rows._fields` (tests/test_lockstep_envs.py checks), in the order `RowStream.append`
# records them: named here, as importing `replay` would import JAX.
ROW_FIELDS = (
    "obs",
    "action",
    "reward",
    "terminated",
    "truncated",
    "autoreset",
    "episode_start",
)


class RowStream:
    """Accumulates rows for `num_lanes` envs and hands them out as fixed-size chunks."""

    def __init__(self, spec: RowLayout | replay.ReplaySpec, num_lanes: int):
        self.spec = spec
        self.num_lanes = num_lanes
        self._rows: list[tuple] = []
        self._previous_done = np.zeros(num_lanes, bool)
        self._previous_autoreset = np.ones(num_lanes, bool)  # first rows start episodes
        self._returns = np.zeros(num_lanes)
        self._lengths = np.zeros(num_lanes, np.int64)

    def append(self, obs, action, reward, terminated, truncated) -> list[tuple[int, float, int]]:
        """Record one step (obs is the observation the action was taken at).

        Returns the episodes that finished at this step as (lane, return, length).
        """
        autoreset = self._previous_done
        reward = np.where(autoreset, 0.0, reward).astype(np.float32)
        terminated = np.asarray(terminated, bool) & ~autoreset
        truncated = np.asarray(truncated, bool) & ~autoreset
        self._rows.append(
            (
                stored_obs(self.spec, obs),
                action,
                reward,
                terminated,
                truncated,
                autoreset,
                self._previous_autoreset,
            )
        )
        self._previous_autoreset = autoreset
        done = terminated | truncated
        self._previous_done = done
        self._returns += reward
        self._lengths += ~autoreset
        if not done.any():
            return []
        finished = [
            (int(lane), float(self._returns[lane]), int(self._lengths[lane]))
            for lane in np.flatnonzero(done)
        ]
        self._returns[done] = 0.0
        self._lengths[done] = 0
        return finished

    def restart_lanes(self, lanes: np.ndarray) -> None:
        """The envs of `lanes` (bool) were reset outside an episode's end (`LockstepEnvs.restart`:
        a fresh trial's first episode): the next row starts a new stream, as a restarted
        collector's first row does, and their running episodes are dropped unreported."""
        # New arrays, not writes into these: the last row recorded holds `_previous_autoreset`
        # as its autoreset.
        self._previous_done = self._previous_done & ~lanes
        self._previous_autoreset = self._previous_autoreset | lanes
        self._returns[lanes] = 0.0
        self._lengths[lanes] = 0

    def has_chunk(self) -> bool:
        return len(self._rows) >= self.spec.chunk_len

    def pop_fields(self) -> dict[str, np.ndarray]:
        """The oldest `chunk_len` rows as numpy arrays of shape (num_lanes, chunk_len, ...), by
        `replay.Rows` field name (what a collector puts in its ring)."""
        rows, self._rows = self._rows[: self.spec.chunk_len], self._rows[self.spec.chunk_len :]
        columns = [np.stack(column, axis=1) for column in zip(*rows, strict=True)]
        columns[0] = columns[0].astype(self.spec.obs_dtype)
        columns[1] = columns[1].astype(self.spec.action_dtype)
        return dict(zip(ROW_FIELDS, columns, strict=True))

    def pop_chunk(self) -> replay.Rows:
        """`pop_fields` as `replay.Rows` (imports JAX: for the learner's own process)."""
        from fastpop.population import replay

        return replay.Rows(**self.pop_fields())

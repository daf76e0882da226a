"""Device replay: ring buffers of environment "lanes", written and sampled inside jit.

A lane is the row-by-row stream of one environment instance under gymnasium's next-step
autoreset. Row t holds the observation o_t at which a_t was taken, a_t, r_t and the flags of that
step. A transition starting at row i takes its next observation from row i+1, so no observation is
stored twice and a time-limit truncation keeps its real final observation (it lives in the
following autoreset row). All functions are pure over a `ReplayState` pytree; callers jit them
(with the state donated for `add`) and vmap them over a population axis for per-member buffers.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fastpop.population.n_step import window as n_step_window
from fastpop.types import EnvSpec, PRNGKey, Transition

# Candidate starts drawn per batch element; the first valid one is used (see `sample`).
NUM_CANDIDATES = 4


class Rows(NamedTuple):
    """Replay rows; leading axes (lanes, time). Flags are bool, reward float32."""

    obs: jax.Array  # stored layout: only the newest frame when frames are stacked
    action: jax.Array  # float32 (action_dim,) or int32 scalar for discrete actions
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    # The obs is the final observation of the episode that ended at the previous row; the env
    # ignored this row's action and reset, so this row starts no transition.
    autoreset: jax.Array
    # The obs is a reset observation (also true for the first row a lane ever receives).
    episode_start: jax.Array


class ReplayState(NamedTuple):
    rows: Rows  # leading (lanes, lane_capacity)
    position: jax.Array  # int32: next row to write, shared by all lanes
    size: jax.Array  # int32: rows written per lane, saturating at lane_capacity


class ReplaySpec(NamedTuple):
    """Static configuration of one buffer (hashable, so it can be a jit static argument)."""

    lanes: int
    lane_capacity: int
    chunk_len: int
    obs_shape: tuple[int, ...]  # as the agent sees it (stacked frames for Atari)
    obs_dtype: np.dtype
    action_dim: int
    discrete: bool
    frame_stack: int

    @property
    def stored_obs_shape(self) -> tuple[int, ...]:
        if self.frame_stack == 1:
            return self.obs_shape
        return (*self.obs_shape[:-1], self.obs_shape[-1] // self.frame_stack)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return () if self.discrete else (self.action_dim,)

    @property
    def action_dtype(self) -> np.dtype:
        return np.dtype(np.int32) if self.discrete else np.dtype(np.float32)


def make_replay_spec(env_spec: EnvSpec, capacity: int, lanes: int, chunk_len: int) -> ReplaySpec:
    """`capacity` is the total number of transitions in one buffer, split evenly over lanes."""
    if lanes < 1 or chunk_len < 1:
        raise ValueError(f"replay needs lanes >= 1 and chunk_len >= 1, got {lanes} and {chunk_len}")
    if capacity % lanes:
        raise ValueError(
            f"replay capacity {capacity:,} must be a multiple of the number of lanes "
            f"(environments feeding the buffer: {lanes}); e.g. {capacity // lanes * lanes:,}"
        )
    lane_capacity = capacity // lanes
    stack = env_spec.frame_stack
    if lane_capacity < max(chunk_len, 2, stack + 1):
        need = lanes * max(chunk_len, 2, stack + 1)
        raise ValueError(
            f"replay capacity {capacity:,} is too small for {lanes} lanes x chunk_len "
            f"{chunk_len} (frame_stack {stack}): it must be at least {need:,}"
        )
    if stack > 1 and env_spec.obs_shape[-1] % stack:
        raise ValueError(
            f"frame_stack {stack} must divide the last observation axis "
            f"{env_spec.obs_shape} (frames are stacked channel-last)"
        )
    return ReplaySpec(
        lanes=lanes,
        lane_capacity=lane_capacity,
        chunk_len=chunk_len,
        obs_shape=tuple(env_spec.obs_shape),
        obs_dtype=np.dtype(env_spec.obs_dtype),
        action_dim=env_spec.action_dim,
        discrete=env_spec.discrete,
        frame_stack=stack,
    )


def row_layout(spec: ReplaySpec, lead: tuple[int, ...]) -> Rows:
    def leaf(shape, dtype):
        return jax.ShapeDtypeStruct((*lead, *shape), np.dtype(dtype))

    return Rows(
        obs=leaf(spec.stored_obs_shape, spec.obs_dtype),
        action=leaf(spec.action_shape, spec.action_dtype),
        reward=leaf((), np.float32),
        terminated=leaf((), bool),
        truncated=leaf((), bool),
        autoreset=leaf((), bool),
        episode_start=leaf((), bool),
    )


def _zeros(spec: ReplaySpec, batch: tuple[int, ...]) -> ReplayState:
    layout = row_layout(spec, (*batch, spec.lanes, spec.lane_capacity))
    rows = Rows(*(jnp.zeros(x.shape, x.dtype) for x in layout))
    # Separate arrays: one buffer used twice could not be donated to `add`.
    return ReplayState(rows, position=jnp.zeros(batch, jnp.int32), size=jnp.zeros(batch, jnp.int32))


def init(spec: ReplaySpec) -> ReplayState:
    return _zeros(spec, ())


def init_population(spec: ReplaySpec, population_size: int) -> ReplayState:
    """Per-member buffers stacked on a leading population axis; vmap `add`/`sample` over it."""
    return _zeros(spec, (population_size,))


def add(spec: ReplaySpec, state: ReplayState, chunk: Rows) -> ReplayState:
    """Writes `chunk_len` rows at `position` in every lane, wrapping around the ring."""
    expected = row_layout(spec, (spec.lanes, spec.chunk_len))
    for name, x, want in zip(Rows._fields, chunk, expected, strict=True):
        chex.assert_shape(x, want.shape, custom_message=f"replay chunk field {name!r}")
        chex.assert_type(x, want.dtype, custom_message=f"replay chunk field {name!r}")
    # Modulo indices (not a slice) so a chunk may straddle the end and the position stays a
    # traced value: one compiled program for every position.
    index = (state.position + jnp.arange(spec.chunk_len, dtype=jnp.int32)) % spec.lane_capacity
    rows = jax.tree.map(
        lambda store, new: store.at[:, index].set(new, unique_indices=True), state.rows, chunk
    )
    position = ((state.position + spec.chunk_len) % spec.lane_capacity).astype(jnp.int32)
    size = jnp.minimum(state.size + spec.chunk_len, spec.lane_capacity).astype(jnp.int32)
    return ReplayState(rows=rows, position=position, size=size)


def can_sample(state: ReplayState, min_size: int) -> jax.Array:
    """True once the buffer holds `min_size` rows over all lanes and at least one transition."""
    lanes = state.rows.reward.shape[-2]
    return (state.size * lanes >= min_size) & (state.size >= 2)


def _stack_frames(spec: ReplaySpec, rows: Rows, lane: jax.Array, row: jax.Array):
    """Stacked obs at `row` and at `row + 1`, padding with the episode's first frame."""
    cap, stack = spec.lane_capacity, spec.frame_stack
    if stack == 1:
        return rows.obs[lane, row], rows.obs[lane, (row + 1) % cap]
    # Window positions 0..stack cover rows row-stack+1 .. row+1 (obs stack ends at position
    # stack-1, next_obs stack at position stack).
    window = jnp.arange(stack + 1)
    window_rows = (row[:, None] - (stack - 1) + window) % cap
    starts = rows.episode_start[lane[:, None], window_rows]

    def stack_ending_at(end: int) -> jax.Array:
        # Frames from before the latest episode start are replaced by the start frame itself,
        # as gymnasium's FrameStackObservation(padding_type="reset") does.
        last_start = jnp.max(jnp.where(starts[:, : end + 1], window[: end + 1], -1), axis=1)
        positions = jnp.maximum(end - stack + 1 + jnp.arange(stack), last_start[:, None])
        frame_rows = jnp.take_along_axis(window_rows, positions, axis=1)
        frames = rows.obs[lane[:, None], frame_rows]  # (B, stack, ..., channels)
        frames = jnp.moveaxis(frames, 1, -2)  # (B, ..., stack, channels), oldest first
        return frames.reshape(*frames.shape[:-2], -1)

    return stack_ending_at(stack - 1), stack_ending_at(stack)


class Positions(NamedTuple):
    """Where a batch's transitions start: lane and row of each, (batch_size,) int32."""

    lane: jax.Array
    row: jax.Array


def sample_positions(
    spec: ReplaySpec, state: ReplayState, key: PRNGKey, batch_size: int
) -> Positions:
    """Draws `batch_size` transition starts uniformly over valid starts (see `sample`)."""
    chex.assert_shape([state.position, state.size], ())
    cap = spec.lane_capacity
    skip = jnp.where(state.size == cap, spec.frame_stack - 1, 0)
    count = jnp.maximum(state.size - 1 - skip, 1)  # valid offsets: skip .. skip+count-1
    oldest = (state.position - state.size) % cap
    lane_key, offset_key = jax.random.split(key)
    shape = (batch_size, NUM_CANDIDATES)
    lanes = jax.random.randint(lane_key, shape, 0, spec.lanes)
    offsets = skip + jax.random.randint(offset_key, shape, 0, count)
    starts = (oldest + offsets) % cap
    # A start is invalid on an autoreset row, and where the next row starts an episode without
    # an autoreset row in between (a restarted collector's fresh stream): s' would be a reset.
    valid = (
        ~state.rows.autoreset[lanes, starts] & ~state.rows.episode_start[lanes, (starts + 1) % cap]
    )
    first = jnp.argmax(valid, axis=1)[:, None]
    any_valid = jnp.any(valid, axis=1)
    first_offset = offsets[:, 0]
    # The row after an autoreset row starts an episode: the fallback when no earlier row is valid.
    fallback = jnp.where(first_offset > skip, first_offset - 1, first_offset + 1)
    fallback = jnp.clip(fallback, skip, skip + count - 1)
    lane = jnp.where(any_valid, jnp.take_along_axis(lanes, first, 1)[:, 0], lanes[:, 0])
    offset = jnp.where(any_valid, jnp.take_along_axis(offsets, first, 1)[:, 0], fallback)
    return Positions(lane=lane, row=(oldest + offset) % cap)


def gather_transitions(
    spec: ReplaySpec, state: ReplayState, positions: Positions, n_step: int = 1, limit=None
) -> Transition:
    """The transitions starting at `positions`; with `n_step` > 1 each spans up to `n_step` rows
    of its episode (`n_step.window`), or up to a traced `limit` <= n_step (a member's own n):
    its reward is the (B, n_step) window, `steps` the rows taken, and `next_obs` the
    observation after the last."""
    rows, lane, row = state.rows, positions.lane, positions.row
    if n_step == 1:
        obs, next_obs = _stack_frames(spec, rows, lane, row)
        return Transition(
            obs=obs,
            action=rows.action[lane, row],
            reward=rows.reward[lane, row],
            next_obs=next_obs,
            terminated=rows.terminated[lane, row],
            truncated=rows.truncated[lane, row],
        )
    cap = spec.lane_capacity
    span = n_step_window(rows, state.position, state.size, cap, lane, row, n_step, limit)
    return Transition(
        obs=_stack_frames(spec, rows, lane, row)[0],
        action=rows.action[lane, row],
        reward=span.rewards,
        next_obs=_stack_frames(spec, rows, lane, span.last_row)[1],
        terminated=span.terminated,
        truncated=span.truncated,
        steps=span.steps,
    )


def sample(spec: ReplaySpec, state: ReplayState, key: PRNGKey, batch_size: int) -> Transition:
    """Draws `batch_size` transitions uniformly over valid starts, all on device.

    A valid start is a written row that is not the newest of its lane (no successor yet), not an
    autoreset row, and, once the ring has wrapped, not among the frame_stack-1 oldest rows (their
    earlier frames are overwritten). Autoreset rows are rejected by drawing NUM_CANDIDATES
    (lane, row) pairs per element and keeping the first valid one: that is exactly uniform over
    valid starts unless all candidates are autoreset rows (probability p**NUM_CANDIDATES for a
    fraction p of autoreset rows, ~1e-12 for 1000-step episodes); then the row before the first
    candidate (the transition that ended that episode) is used, a negligible bias towards
    episode ends. Sampling an empty buffer returns zeros (gate with `can_sample`).
    """
    return gather_transitions(spec, state, sample_positions(spec, state, key, batch_size))


@dataclasses.dataclass(frozen=True)
class Sampler:
    """One training batch of `batch_size` from one buffer, inside jit: what the executors call
    (`sampler(buffer, key)`), in two halves for a loop that draws every step's positions at
    once (`population.member_update_loop`): the buffer does not change during an update call."""

    spec: ReplaySpec
    batch_size: int
    n_step: int = 1  # rows a transition's return spans at most (`gather_transitions`)

    def __call__(self, state: ReplayState, key: PRNGKey, limit=None) -> Transition:
        return self.gather(state, self.positions(state, key), limit)

    def positions(self, state: ReplayState, key: PRNGKey) -> Positions:
        return sample_positions(self.spec, state, key, self.batch_size)

    def gather(self, state: ReplayState, positions: Positions, limit=None) -> Transition:
        """`limit`: the member's own n (traced, <= n_step; `own_n_args`), None: n_step."""
        return gather_transitions(self.spec, state, positions, self.n_step, limit)


def own_n_args(hparams, n_step: int) -> tuple:
    """What a sampler is called with after buffer and key for a member: with n-step windows
    (`n_step` > 1) the member's own n, its hparam `n_step` (an agent without one: none, the
    whole window); a sampler of one-step transitions takes buffer and key only, as any
    `SampleFn`."""
    own_n = getattr(hparams, "n_step", None)
    return () if n_step == 1 or own_n is None else (own_n,)


# --- memory planning (host side) ---


class MemoryEstimate(NamedTuple):
    bytes_needed: int
    bytes_available: int
    fits: bool
    message: str


def memory_estimate_bytes(spec: ReplaySpec) -> int:
    """Exact bytes of one buffer's arrays (rows plus the two int32 counters)."""
    layout = row_layout(spec, (spec.lanes, spec.lane_capacity))
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in layout) + 2 * 4


def _human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def default_available_bytes() -> int:
    """The first device's memory limit (GPU/TPU), else the host's available RAM."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # backends without memory stats raise various errors; fall back to RAM
        stats = None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_estimate(
    env_spec: EnvSpec,
    capacity: int,
    lanes: int,
    population_size: int,
    shared: bool,
    available_bytes: int | None = None,
) -> MemoryEstimate:
    """Memory of all replay buffers: `population_size` buffers of `capacity` transitions each,
    or one shared buffer of `capacity` transitions when `shared`. `lanes` is per buffer."""
    spec = make_replay_spec(env_spec, capacity, lanes, chunk_len=1)
    buffers = 1 if shared else population_size
    needed = buffers * memory_estimate_bytes(spec)
    available = default_available_bytes() if available_bytes is None else int(available_bytes)
    shape = spec.stored_obs_shape
    if spec.frame_stack > 1 and shape[-1] == 1:
        shape = shape[:-1]
    noun = "frames" if spec.frame_stack > 1 else "observations"
    what = f"{capacity:,} transitions of {'x'.join(map(str, shape))} {spec.obs_dtype.name} {noun}"
    if shared:
        what, advice = f"one shared buffer of {what}", "replay.capacity"
    else:
        members = "member" if population_size == 1 else "members"
        what, advice = f"{population_size} {members} x {what}", "replay.capacity or population.size"
    fits = needed <= available
    if fits:
        message = f"replay needs {_human_bytes(needed)} ({what}) of {_human_bytes(available)}"
        message += " available"
    else:
        message = (
            f"replay needs {_human_bytes(needed)} ({what}) but only {_human_bytes(available)} "
            f"is available: lower {advice}"
        )
    return MemoryEstimate(needed, available, fits, message)

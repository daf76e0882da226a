"""Replay: ring wrap-around, transition correctness, population modes, frame stacks, memory."""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
import pytest

from fastpop.population import replay
from fastpop.types import EnvSpec, stored_obs

VECTOR_ENV = EnvSpec(obs_shape=(3,), action_dim=2)
ATARI_ENV = EnvSpec(
    obs_shape=(84, 84, 4), obs_dtype=np.dtype(np.uint8), num_actions=6, frame_stack=4
)


def simulate_flags(lanes: int, length: int, seed: int, max_episode_len: int = 5) -> dict:
    """Flags of next-step-autoreset streams with random episode lengths, (lanes, length) each."""
    rng = np.random.default_rng(seed)
    flags = {k: np.zeros((lanes, length), bool) for k in replay.Rows._fields[3:]}
    for lane in range(lanes):
        flags["episode_start"][lane, 0] = True
        steps_left = rng.integers(1, max_episode_len + 1)
        for t in range(length - 1):
            if flags["autoreset"][lane, t]:  # the env resets: next row is a reset observation
                flags["episode_start"][lane, t + 1] = True
                steps_left = rng.integers(1, max_episode_len + 1)
                continue
            steps_left -= 1
            if steps_left == 0:
                flags["terminated" if rng.random() < 0.5 else "truncated"][lane, t] = True
                flags["autoreset"][lane, t + 1] = True
    return flags


def counter_rows(lanes: int, length: int, seed: int, lane_offset: int = 0) -> replay.Rows:
    """obs = (lane id, row counter, 0), so a sampled obs names the row it came from."""
    flags = simulate_flags(lanes, length, seed)
    lane_id = np.broadcast_to(np.arange(lanes)[:, None] + lane_offset, (lanes, length))
    t = np.broadcast_to(np.arange(length)[None], (lanes, length))
    obs = np.stack([lane_id, t, np.zeros_like(t)], -1).astype(np.float32)
    action = np.stack([t, lane_id], -1).astype(np.float32)
    return replay.Rows(obs=obs, action=action, reward=(t + 0.5).astype(np.float32), **flags)


def chunk_slices(rows: replay.Rows, chunk_len: int, time_axis: int):
    length = rows.reward.shape[time_axis]
    for start in range(0, length, chunk_len):
        index = (slice(None),) * time_axis + (slice(start, start + chunk_len),)
        yield replay.Rows(*(np.asarray(x)[index] for x in rows))


def add_all(spec, state, rows, time_axis=1, add_fn=None):
    add_fn = add_fn or jax.jit(partial(replay.add, spec), donate_argnums=0)
    for chunk in chunk_slices(rows, spec.chunk_len, time_axis):
        state = add_fn(state, chunk)
    return state


def valid_starts(rows: replay.Rows, spec: replay.ReplaySpec, size: int) -> set:
    """(lane id, t) pairs a sampler may return, from the host-side truth."""
    autoreset = np.asarray(rows.autoreset)
    length = autoreset.shape[-1]
    # Once full, the oldest frame_stack-1 rows lack their earlier frames.
    first = length - size + (spec.frame_stack - 1 if size == spec.lane_capacity else 0)
    lanes = range(autoreset.shape[0])
    return {(lane, t) for lane in lanes for t in range(first, length - 1) if not autoreset[lane, t]}


def check_counter_batch(batch, rows: replay.Rows, lane_offset: int = 0) -> set:
    """Every sampled transition is the stored row and its real successor; returns (lane, t)."""
    obs, next_obs = np.asarray(batch.obs), np.asarray(batch.next_obs)
    lane_id, t = obs[:, 0].astype(int), obs[:, 1].astype(int)
    lane = lane_id - lane_offset
    np.testing.assert_array_equal(next_obs, np.stack([lane_id, t + 1, 0 * t], -1))
    np.testing.assert_array_equal(batch.action, np.stack([t, lane_id], -1))
    np.testing.assert_array_equal(batch.reward, t + 0.5)
    assert not np.asarray(rows.autoreset)[lane, t].any()
    np.testing.assert_array_equal(batch.terminated, np.asarray(rows.terminated)[lane, t])
    np.testing.assert_array_equal(batch.truncated, np.asarray(rows.truncated)[lane, t])
    # An episode's last transition gets the final obs, held by the following autoreset row.
    ended = np.asarray(batch.terminated) | np.asarray(batch.truncated)
    assert np.asarray(rows.autoreset)[lane, t + 1][ended].all()
    return set(zip(lane_id.tolist(), t.tolist(), strict=True))


def test_wrap_around_keeps_newest_rows_in_order():
    spec = replay.make_replay_spec(VECTOR_ENV, capacity=20, lanes=2, chunk_len=4)
    rows = counter_rows(lanes=2, length=16, seed=0)
    state = replay.init(spec)
    add = jax.jit(partial(replay.add, spec))
    for n, chunk in enumerate(chunk_slices(rows, 4, time_axis=1), start=1):
        state = add(state, chunk)
        assert int(state.position) == (4 * n) % 10
        assert int(state.size) == min(4 * n, 10)
    # The third chunk (rows 8..11) straddled the end; the ring holds rows 6..15, oldest first.
    ordered = np.roll(np.asarray(state.rows.obs), -int(state.position), axis=1)
    np.testing.assert_array_equal(ordered[:, :, 1], np.tile(np.arange(6, 16), (2, 1)))
    np.testing.assert_array_equal(ordered[:, :, 0], [[0] * 10, [1] * 10])
    np.testing.assert_array_equal(
        np.roll(np.asarray(state.rows.autoreset), -6, axis=1), rows.autoreset[:, 6:]
    )


@pytest.mark.parametrize("length", [12, 28])  # partly filled, wrapped
def test_sampled_transitions_are_real(length):
    spec = replay.make_replay_spec(VECTOR_ENV, capacity=48, lanes=3, chunk_len=4)
    rows = counter_rows(lanes=3, length=length, seed=1)
    state = add_all(spec, replay.init(spec), rows)
    sample = jax.jit(partial(replay.sample, spec), static_argnums=2)
    batch = sample(state, jax.random.key(0), 16384)
    assert batch.obs.shape == (16384, 3) and batch.action.shape == (16384, 2)
    seen = check_counter_batch(batch, rows)
    assert seen == valid_starts(rows, spec, int(state.size))  # every valid start, nothing else
    assert np.asarray(batch.truncated).any() and np.asarray(batch.terminated).any()
    # Uniform over valid starts: with ~40 of them, counts stay within 25% of the mean.
    _, counts = np.unique(np.asarray(batch.obs[:, :2]), axis=0, return_counts=True)
    assert counts.min() > 0.75 * counts.mean() and counts.max() < 1.25 * counts.mean()


def test_per_member_buffers_are_isolated():
    population, lanes = 3, 2
    spec = replay.make_replay_spec(VECTOR_ENV, capacity=24, lanes=lanes, chunk_len=3)
    member_rows = [counter_rows(lanes, 18, seed=m, lane_offset=m * lanes) for m in range(3)]
    stacked = jax.tree.map(lambda *x: np.stack(x), *member_rows)
    add = jax.jit(jax.vmap(partial(replay.add, spec)), donate_argnums=0)
    state = add_all(
        spec, replay.init_population(spec, population), stacked, time_axis=2, add_fn=add
    )
    assert state.position.shape == (population,)
    sample = jax.jit(jax.vmap(partial(replay.sample, spec), in_axes=(0, 0, None)), static_argnums=2)
    batch = sample(state, jax.random.split(jax.random.key(1), population), 512)
    assert batch.obs.shape == (population, 512, 3)
    for m in range(population):
        member_batch = jax.tree.map(lambda x, m=m: x[m], batch)
        seen = check_counter_batch(member_batch, member_rows[m], lane_offset=m * lanes)
        assert {lane for lane, _ in seen} == {m * lanes, m * lanes + 1}
    assert replay.can_sample(state, 10).shape == (population,)


def test_shared_buffer_samples_all_members_lanes():
    spec = replay.make_replay_spec(VECTOR_ENV, capacity=60, lanes=6, chunk_len=5)
    rows = counter_rows(lanes=6, length=15, seed=2)
    state = add_all(spec, replay.init(spec), rows)
    batch = jax.jit(partial(replay.sample, spec), static_argnums=2)(state, jax.random.key(2), 1024)
    seen = check_counter_batch(batch, rows)
    assert {lane for lane, _ in seen} == set(range(6))


def atari_stream(lanes: int, length: int, seed: int):
    """Random frames, flags, and the true stacked observations under reset padding."""
    rng = np.random.default_rng(seed)
    flags = simulate_flags(lanes, length, seed, max_episode_len=6)
    frames = rng.integers(0, 256, (lanes, length, 84, 84, 1), dtype=np.uint8)
    stacks = np.zeros((lanes, length, 84, 84, 4), np.uint8)
    for lane in range(lanes):
        for t in range(length):
            if flags["episode_start"][lane, t]:
                stacks[lane, t] = np.repeat(frames[lane, t], 4, axis=-1)
            else:
                stacks[lane, t] = np.concatenate(
                    [stacks[lane, t - 1, ..., 1:], frames[lane, t]], -1
                )
    t = np.arange(length)[None] + 10_000 * np.arange(lanes)[:, None]
    rows = replay.Rows(
        obs=stored_obs(ATARI_ENV, stacks),
        action=t.astype(np.int32),
        reward=np.zeros((lanes, length), np.float32),
        **flags,
    )
    np.testing.assert_array_equal(rows.obs, frames)
    return rows, stacks


@pytest.mark.parametrize("length", [9, 30])  # partly filled, wrapped
def test_uint8_frame_stacks_round_trip(length):
    spec = replay.make_replay_spec(ATARI_ENV, capacity=24, lanes=2, chunk_len=3)
    rows, stacks = atari_stream(lanes=2, length=length, seed=3)
    state = add_all(spec, replay.init(spec), rows)
    assert state.rows.obs.shape == (2, 12, 84, 84, 1) and state.rows.obs.dtype == np.uint8
    batch = jax.jit(partial(replay.sample, spec), static_argnums=2)(state, jax.random.key(3), 1024)
    assert batch.obs.shape == (1024, 84, 84, 4)
    assert batch.obs.dtype == np.uint8 and batch.next_obs.dtype == np.uint8
    obs, next_obs = np.asarray(batch.obs), np.asarray(batch.next_obs)
    seen = set()
    for i, code in enumerate(np.asarray(batch.action)):
        lane, t = divmod(int(code), 10_000)
        np.testing.assert_array_equal(obs[i], stacks[lane, t])
        np.testing.assert_array_equal(next_obs[i], stacks[lane, t + 1])
        seen.add((lane, t))
    assert seen == valid_starts(rows, spec, int(state.size))
    assert any(rows.episode_start[lane, t] and t > 0 for lane, t in seen)
    assert any(rows.episode_start[lane, t - 1] for lane, t in seen)  # one step after a reset
    # One frame per row: obs bytes are 1/4 of stacked storage.
    per_row = 84 * 84 * 1 + 4 + 4 + 4 * 1  # frame, int32 action, float32 reward, 4 bool flags
    assert replay.memory_estimate_bytes(spec) == 2 * 12 * per_row + 2 * 4


def test_sampling_an_empty_buffer_is_harmless():
    for env in (VECTOR_ENV, ATARI_ENV):
        spec = replay.make_replay_spec(env, capacity=16, lanes=2, chunk_len=2)
        state = replay.init(spec)
        assert not replay.can_sample(state, 1)
        batch = jax.jit(partial(replay.sample, spec), static_argnums=2)(state, jax.random.key(0), 8)
        assert not np.isnan(np.asarray(batch.obs, np.float32)).any()
        assert batch.next_obs.shape == (8, *env.obs_shape)
    state = add_all(spec, state, atari_stream(2, 2, seed=0)[0])
    assert replay.can_sample(state, 4) and not replay.can_sample(state, 5)


def test_make_replay_spec_rejects_bad_sizes():
    with pytest.raises(ValueError, match="multiple of the number of lanes"):
        replay.make_replay_spec(VECTOR_ENV, capacity=10, lanes=3, chunk_len=1)
    with pytest.raises(ValueError, match="too small"):
        replay.make_replay_spec(VECTOR_ENV, capacity=8, lanes=4, chunk_len=4)


class ReplayTooLarge(ValueError):
    """The replay buffers would not fit in accelerator (or host) memory."""


def check_fits(estimate: replay.MemoryEstimate) -> None:
    if not estimate.fits:
        raise ReplayTooLarge(estimate.message)


def test_memory_estimate_for_atari():
    one = replay.memory_estimate(ATARI_ENV, 1_000_000, lanes=8, population_size=1, shared=False)
    assert one.bytes_needed == 1_000_000 * (84 * 84 + 12) + 8  # ~7 GB, not 4x that
    assert one.bytes_available > 0
    big = replay.memory_estimate(
        ATARI_ENV, 1_000_000, lanes=8, population_size=80, shared=False, available_bytes=23 * 2**30
    )
    assert big.bytes_needed == 80 * one.bytes_needed and not big.fits
    for words in ("526.6 GiB", "23.0 GiB", "80 members", "1,000,000", "84x84 uint8 frames"):
        assert words in big.message
    assert "lower replay.capacity or population.size" in big.message
    with pytest.raises(ReplayTooLarge, match="replay needs"):
        check_fits(big)
    shared = replay.memory_estimate(
        ATARI_ENV, 1_000_000, lanes=80, population_size=80, shared=True, available_bytes=2**40
    )
    assert shared.fits and shared.bytes_needed == one.bytes_needed
    check_fits(shared)


def test_add_compiles_once_for_all_positions():
    traces = 0
    spec = replay.make_replay_spec(VECTOR_ENV, capacity=20, lanes=2, chunk_len=3)

    def counted_add(state, chunk):
        nonlocal traces
        traces += 1
        return replay.add(spec, state, chunk)

    add = jax.jit(counted_add, donate_argnums=0)
    state = add_all(spec, replay.init(spec), counter_rows(2, 30, seed=4), add_fn=add)
    assert int(state.position) == 30 % 10 and traces == 1

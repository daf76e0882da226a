"""lockstep_envs.LockstepEnvs against the gymnasium vector env it replaces in the collectors."""

from __future__ import annotations

import numpy as np
import pytest

from fastpop.collect.lockstep_envs import LockstepEnvs
from fastpop.envs import make_vector_env


# CartPole's episodes end by termination, Pendulum's by truncation at 200 steps.
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_lockstep_envs_step_exactly_as_the_next_step_autoreset_vector_env(env_id):
    num_envs, steps, seed = 3, 450, 17
    reference = make_vector_env(env_id, num_envs, seed)
    lockstep = LockstepEnvs(make_vector_env(env_id, num_envs, seed))
    try:
        want, _ = reference.reset(seed=seed)
        got = lockstep.reset(seed=seed)
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
        reference.action_space.seed(5)
        episodes_ended = 0
        for _ in range(steps):
            actions = reference.action_space.sample()
            obs, reward, terminated, truncated, _ = reference.step(actions)
            got = lockstep.step(actions)
            for mine, theirs in zip(got, (obs, reward, terminated, truncated), strict=True):
                np.testing.assert_array_equal(mine, theirs)
                assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
            episodes_ended += int(np.sum(terminated | truncated))
        assert episodes_ended >= num_envs  # autoresets were exercised
    finally:
        reference.close()
        lockstep.close()


def test_a_collectors_row_fields_are_the_replays():
    """A collector names its chunk's fields without importing `replay` (JAX): the same names,
    in the same order, as the replay's rows."""
    from fastpop.collect.rows import ROW_FIELDS
    from fastpop.population import replay

    assert replay.Rows._fields == ROW_FIELDS


def test_a_restarted_env_starts_a_new_stream_and_an_ending_one_is_left_to_its_reset_step():
    """A fresh trial's envs (`LockstepEnvs.restart`, `RowStream.restart_lanes`): a running
    episode ends there unflagged and unreported, the next row starts a new stream (as a
    restarted collector's first row); an env whose episode just ended keeps its reset step."""
    from fastpop.collect.rows import RowLayout, RowStream

    envs = LockstepEnvs(make_vector_env("CartPole-v1", 3, 0))
    stream = RowStream(RowLayout(4, (4,), np.dtype(np.float32), np.dtype(np.int32), 1), 3)
    obs, actions = envs.reset(seed=0), np.zeros(3, np.int64)
    while True:  # until env 2's episode ends (always pushed left) while 0 and 1 run on
        next_obs, reward, terminated, truncated = envs.step(actions)
        stream.append(obs, actions, reward, terminated, truncated)
        obs = next_obs
        if terminated[2] or truncated[2]:
            break
    assert not (terminated[:2] | truncated[:2]).any()
    obs, reset = envs.restart(np.array([False, True, True]), obs)
    assert reset.tolist() == [False, True, False]
    stream.restart_lanes(reset)
    assert stream.append(obs, actions, *envs.step(actions)[1:]) == []  # nothing reported
    last = stream._rows[-1]
    autoreset, episode_start = last[5], last[6]
    assert autoreset.tolist() == [False, False, True]  # env 2: its reset step
    assert episode_start.tolist() == [False, True, False]  # env 1: a new stream
    envs.close()


def test_restarting_lanes_never_rewrites_a_recorded_row():
    """`RowStream.restart_lanes` changes what the next row records, not the row before it: it
    set `_previous_autoreset` in place, the very array the last row recorded as its autoreset."""
    from fastpop.collect.rows import RowLayout, RowStream

    stream = RowStream(RowLayout(2, (1,), np.dtype(np.float32), np.dtype(np.int32), 1), 2)
    obs, action, reward = np.zeros((2, 1)), np.zeros(2, np.int32), np.ones(2)
    running = np.zeros(2, bool)
    stream.append(obs, action, reward, running, running)
    recorded = [np.copy(field) for field in stream._rows[0]]
    stream.restart_lanes(np.array([True, False]))
    stream.append(obs, action, reward, running, running)
    for before, after in zip(recorded, stream._rows[0], strict=True):
        np.testing.assert_array_equal(after, before)
    rows = stream.pop_fields()
    assert rows["autoreset"].tolist() == [[False, False], [False, False]]
    assert rows["episode_start"].tolist() == [[True, True], [True, False]]  # lane 0 restarted

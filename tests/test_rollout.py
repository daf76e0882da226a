"""rollout.LockstepEnvs against the gymnasium vector env it replaces in the collectors."""

from __future__ import annotations

import numpy as np
import pytest

from fastpop.collect.rollout import LockstepEnvs
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
    from fastpop.collect.rollout import ROW_FIELDS
    from fastpop.population import replay

    assert replay.Rows._fields == ROW_FIELDS

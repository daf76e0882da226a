"""n-step returns (`agent.n_step`): the replay's windows against a hand-written lane that crosses
a termination and a truncation, their discounted return, and the config field; a member's own
n (hparam `n_step`, traced) against the static n of that value. Vectorized ==
sequential with n-step: tests/test_population.py; sharded == one device, both collection
modes: tests/sharding_cases.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import population
from fastpop.agents import losses
from fastpop.config import ConfigError, load_config
from fastpop.population import replay
from fastpop.types import EnvSpec
from tests.helpers import leaves_allclose, random_buffers, stacked_hparams, tiny_agent
from tests.test_population import PER_MEMBER, run_executor

# One lane of ten rows. Row 2's step terminates its episode and row 6's is truncated (a time
# limit); rows 3 and 7 are the reset steps that hold the final observations (next-step
# autoreset), and rows 4 and 8 start episodes. Each row's observation is its index.
REWARDS = [1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 7.0, 0.0, 9.0, 10.0]
TERMINATED, TRUNCATED, AUTORESET, STARTS = {2}, {6}, {3, 7}, {0, 4, 8}
DISCOUNT = 0.9


def lane_buffer(capacity: int = 16):
    env_spec = EnvSpec(obs_shape=(1,), action_dim=1, action_low=-1.0, action_high=1.0)
    spec = replay.make_replay_spec(env_spec, capacity=capacity, lanes=1, chunk_len=len(REWARDS))
    flags = lambda rows: jnp.asarray([[i in rows for i in range(len(REWARDS))]])
    chunk = replay.Rows(
        obs=jnp.arange(len(REWARDS), dtype=jnp.float32).reshape(1, -1, 1),
        action=jnp.zeros((1, len(REWARDS), 1)),
        reward=jnp.asarray([REWARDS], jnp.float32),
        terminated=flags(TERMINATED),
        truncated=flags(TRUNCATED),
        autoreset=flags(AUTORESET),
        episode_start=flags(STARTS),
    )
    return spec, replay.add(spec, replay.init(spec), chunk)


# start row -> (rewards of its 3-step window, steps, terminated, truncated, next observation)
EXPECTED = {
    0: ([1, 2, 3], 3, True, False, 3),  # runs into the termination: no bootstrap
    1: ([2, 3, 0], 2, True, False, 3),
    2: ([3, 0, 0], 1, True, False, 3),
    4: ([5, 6, 7], 3, False, True, 7),  # through the truncation: bootstraps from row 7's obs
    5: ([6, 7, 0], 2, False, True, 7),
    8: ([9, 0, 0], 1, False, False, 9),  # row 9 is the newest: its successor is not written
}


def test_windows_stop_at_episode_ends_and_at_the_newest_row():
    spec, buffer = lane_buffer()
    starts = np.asarray(sorted(EXPECTED), np.int32)
    positions = replay.Positions(lane=np.zeros_like(starts), row=starts)
    batch = replay.gather_transitions(spec, buffer, positions, n_step=3)
    want = [EXPECTED[start] for start in starts]
    np.testing.assert_array_equal(batch.reward, [w[0] for w in want])
    np.testing.assert_array_equal(batch.steps, [w[1] for w in want])
    np.testing.assert_array_equal(batch.terminated, [w[2] for w in want])
    np.testing.assert_array_equal(batch.truncated, [w[3] for w in want])
    np.testing.assert_array_equal(batch.next_obs[:, 0], [w[4] for w in want])
    np.testing.assert_array_equal(batch.obs[:, 0], starts)
    # The discounted returns and the discount of each bootstrap, as the critics' targets use
    # them (a terminated window's bootstrap is then dropped by `bootstrap_target`).
    reward, discount = losses.discounted_rewards(batch, jnp.float32(DISCOUNT))
    np.testing.assert_allclose(reward, [5.23, 4.7, 3.0, 16.07, 12.3, 9.0], rtol=1e-6)
    np.testing.assert_allclose(discount, [0.729, 0.81, 0.9, 0.729, 0.81, 0.9], rtol=1e-6)


def test_a_window_never_wraps_past_the_oldest_row_of_a_full_ring():
    spec, buffer = lane_buffer(capacity=10)  # full: row 0 is the oldest, row 9 the newest
    positions = replay.Positions(lane=np.zeros(2, np.int32), row=np.asarray([8, 4], np.int32))
    batch = replay.gather_transitions(spec, buffer, positions, n_step=3)
    np.testing.assert_array_equal(batch.steps, [1, 3])
    np.testing.assert_array_equal(batch.next_obs[:, 0], [9, 7])


def test_one_step_transitions_keep_their_reward_and_the_members_discount():
    spec, buffer = lane_buffer()
    positions = replay.Positions(lane=np.zeros(2, np.int32), row=np.asarray([0, 4], np.int32))
    one = replay.gather_transitions(spec, buffer, positions)
    assert one.steps is None and one.reward.shape == (2,)
    reward, discount = losses.discounted_rewards(one, jnp.float32(DISCOUNT))
    np.testing.assert_array_equal(reward, [1.0, 5.0])
    np.testing.assert_allclose(discount, [DISCOUNT, DISCOUNT])
    np.testing.assert_array_equal(one.next_obs[:, 0], [1, 5])


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_n_step_is_an_agent_field_of_every_algorithm(algo):
    env = ["env.id=CartPole-v1"] if algo == "dqn" else []
    config = load_config(None, [f"algo={algo}", *env, "agent.n_step=3"])
    assert config.agent["n_step"] == 3
    with pytest.raises(ConfigError, match=r"agent\.n_step: must be >= 1, got 0"):
        load_config(None, [f"algo={algo}", *env, "agent.n_step=0"])


def test_a_traced_limit_gives_the_windows_of_that_static_n():
    """A member's own n (hparam n_step, traced) over a replay gathering agent.n_step = 3 rows:
    the windows, steps, flags and next observations of a static n of that value, the rewards
    past it zero."""
    spec, buffer = lane_buffer()
    starts = np.asarray(sorted(EXPECTED), np.int32)
    positions = replay.Positions(lane=np.zeros_like(starts), row=starts)
    gather = jax.jit(lambda limit: replay.gather_transitions(spec, buffer, positions, 3, limit))
    for n in (1, 2, 3):
        traced, static = gather(jnp.int32(n)), replay.gather_transitions(spec, buffer, positions, n)
        rewards = np.asarray(static.reward).reshape(len(starts), -1)
        np.testing.assert_array_equal(traced.reward[:, :n], rewards)
        np.testing.assert_array_equal(traced.reward[:, n:], 0.0)
        np.testing.assert_array_equal(traced.steps, 1 if n == 1 else static.steps)
        for field in ("obs", "next_obs", "terminated", "truncated", "action"):
            np.testing.assert_array_equal(getattr(traced, field), getattr(static, field), field)


@pytest.mark.parametrize("name", ["td3", "sac", "dqn"])
def test_members_own_n_steps_in_one_program_train_as_static_n_steps(name):
    """One vectorized update of members whose hparam n_step is 1, 2 and 3 (agent.n_step = 3):
    member i's state after it equals member i's in a population whose agent.n_step is
    static at i + 1 (same buffers, keys and other hparams)."""
    size, per_member = 3, {"n_step": [1, 2, 3], **PER_MEMBER[name]}
    spec, buffers = random_buffers(name, size)

    def trained(n_step: int, n_steps: list[int]):
        agent = tiny_agent(name, n_step=n_step)
        hparams = stacked_hparams(agent, size, **{**per_member, "n_step": n_steps})
        states = population.init_population(agent, jax.random.key(0), hparams)
        return run_executor("vectorized", agent, spec, buffers, hparams, states, calls=1)[0]

    traced = trained(3, [1, 2, 3])
    for member, n in enumerate((1, 2, 3)):
        static = trained(n, [n] * size)
        assert leaves_allclose(population.member(traced, member), population.member(static, member))
    assert not leaves_allclose(population.member(traced, 0), population.member(traced, 2))

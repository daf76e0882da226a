"""Lanes on the device keep gymnasium's next-step autoreset: every transition's next
observation is the real next state (a terminal or time-limit final state included), never a
reset state, checked against stepping the same env from the recorded states: on gymnax's
CartPole-v1, whose programs compile in a second, brax's inverted pendulum and Playground's
CartpoleBalance (which only the time limit ends). The rollout does not know the family."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.collect import device_rollout
from fastpop.envs.device_envs import make_device_env
from tests.dependencies import require

require("gymnax")

LANES, STEPS, TIME_LIMIT = 6, 60, 12


@pytest.fixture(scope="module")
def cartpole():
    # Random actions topple it within ~22 steps (termination); the short time limit
    # truncates the episodes that last.
    return make_device_env("gymnax/CartPole-v1")


def random_act(env):
    action_shape = () if env.spec.discrete else (env.spec.action_dim,)
    return lambda obs, key, t=0: device_rollout.random_actions(
        env.spec, key, obs.shape[:1] + action_shape
    )


def brax_pendulum():
    require("brax")
    # spring compiles quickest; random pushes topple it within a few steps (termination)
    return make_device_env("brax/inverted_pendulum", "spring")


def playground_cartpole():
    require("mujoco_playground")
    return make_device_env("playground/CartpoleBalance")


@pytest.mark.parametrize("family", ["gymnax", "brax", "playground"])
def test_next_observations_are_real_next_states_and_resets_start_rows(cartpole, family):
    env = {"gymnax": lambda: cartpole, "brax": brax_pendulum, "playground": playground_cartpole}
    env = env[family]()
    act = random_act(env)

    def one(state, key):
        action = act(state.env.obs, key)
        new_state, row, _ = device_rollout.step(env, TIME_LIMIT, state, action)
        return new_state, (row, state.env)

    # compiled, as the collection does (op by op, MJX's reset takes ~20 s on a CPU)
    state = jax.jit(lambda key: device_rollout.init(env, key, LANES))(jax.random.key(0))
    run = jax.jit(lambda s, k: jax.lax.scan(one, s, jax.random.split(k, STEPS)))
    _, (rows, env_states) = run(state, jax.random.key(1))
    rows = jax.tree.map(np.asarray, rows)  # (STEPS, LANES, ...)
    # The state every transition row started from, stepped again with its action.
    again = jax.jit(jax.vmap(jax.vmap(env.step)))(env_states, jnp.asarray(rows.action))
    starts = ~rows.autoreset[:-1]
    real_next = np.asarray(again.obs)[:-1][starts]
    np.testing.assert_allclose(rows.obs[1:][starts], real_next, rtol=1e-5, atol=1e-6)
    assert rows.truncated.any()
    # Both kinds of episode end occur, but a Control Suite task never terminates.
    assert rows.terminated.any() == (family != "playground")
    ended = rows.terminated | rows.truncated
    # The row after an episode end is its reset step: action ignored, no reward or flags; the
    # row after that holds a reset observation.
    np.testing.assert_array_equal(rows.autoreset[1:], ended[:-1])
    np.testing.assert_array_equal(rows.episode_start[1:], rows.autoreset[:-1])
    assert not (rows.reward[rows.autoreset]).any()
    assert not (rows.terminated | rows.truncated)[rows.autoreset].any()
    # Lanes start as if an episode had just ended: their first step is a reset step.
    assert rows.autoreset[0].all() and rows.episode_start[1].all()
    # Time limits truncate after exactly TIME_LIMIT steps of one episode.
    length = np.zeros(LANES, int)
    for t in range(STEPS):
        length = np.where(rows.autoreset[t], 0, length + 1)
        assert (rows.truncated[t] == (~rows.autoreset[t] & (length >= TIME_LIMIT))).all()


def test_rollout_returns_rows_lane_major_and_episode_returns(cartpole):
    act = random_act(cartpole)
    state = device_rollout.init(cartpole, jax.random.key(0), LANES)
    rollout = jax.jit(lambda s, k: device_rollout.rollout(cartpole, TIME_LIMIT, s, act, k, STEPS))
    _, rows, finished = rollout(state, jax.random.key(1))
    assert rows.obs.shape == (LANES, STEPS, *cartpole.spec.obs_shape)
    rewards, ended = np.asarray(rows.reward), np.asarray(finished.ended)
    returns = np.asarray(finished.episode_return)
    for lane in range(LANES):  # each finished return is the sum of its episode's rewards
        ends = np.flatnonzero(ended[lane])
        starts = np.concatenate([[0], ends[:-1] + 1])
        expected = [rewards[lane, s : e + 1].sum() for s, e in zip(starts, ends, strict=True)]
        np.testing.assert_allclose(returns[lane, ends], expected, rtol=1e-5)


def test_evaluation_counts_one_episode_per_lane(cartpole):
    left = lambda obs, key, t: jnp.zeros(obs.shape[:1], jnp.int32)
    evaluate = jax.jit(lambda k: device_rollout.evaluate(cartpole, TIME_LIMIT, left, k, 3))
    returns = np.asarray(evaluate(jax.random.key(2)))
    # CartPole pays 1 per step alive and pushed left it falls in ~10 steps: each lane counts
    # its one episode, whatever the steps left until the time limit.
    assert returns.shape == (3,) and np.all((returns >= 5) & (returns < TIME_LIMIT))

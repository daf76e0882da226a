"""Random replay data of the paper's shapes, by action kind (HalfCheetah's for TD3 / SAC,
Atari's for DQN): per-member device buffers filled with random rows, for the update benchmark,
the device benchmark's update-alone row and `fastpop doctor`'s update run.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.agents import registry
from fastpop.population import replay
from fastpop.types import EnvSpec, stored_obs

# The paper's shapes, by action kind: HalfCheetah for TD3/SAC, Atari (Pong: 6 actions) for DQN.
SPECS_BY_ACTIONS = {
    "continuous": EnvSpec(obs_shape=(17,), action_dim=6),
    "discrete": EnvSpec(
        obs_shape=(84, 84, 4), obs_dtype=np.dtype(np.uint8), num_actions=6, frame_stack=4
    ),
}
# Rows of random data per member: enough to sample from, small enough for P=64 in RAM.
REPLAY_ROWS_BY_ACTIONS = {"continuous": 10_000, "discrete": 1_000}
# by algorithm: those registered when the benchmark is imported
BENCH_SPECS = {entry.name: SPECS_BY_ACTIONS[entry.actions] for entry in registry.entries()}
BENCH_REPLAY_ROWS = {
    entry.name: REPLAY_ROWS_BY_ACTIONS[entry.actions] for entry in registry.entries()
}


def random_rows(spec: replay.ReplaySpec, env_spec: EnvSpec, key) -> replay.Rows:
    """One lane full of random rows, as a chunk for `replay.add`."""
    shape = (spec.lanes, spec.chunk_len)
    obs_key, action_key, reward_key, done_key = jax.random.split(key, 4)
    stored_shape = stored_obs(env_spec, np.zeros((1, *env_spec.obs_shape))).shape[1:]
    if env_spec.obs_dtype == np.uint8:
        obs = jax.random.randint(obs_key, (*shape, *stored_shape), 0, 256).astype(jnp.uint8)
    else:
        obs = jax.random.normal(obs_key, (*shape, *stored_shape))
    if env_spec.discrete:
        action = jax.random.randint(action_key, shape, 0, env_spec.num_actions)
    else:
        action = jax.random.uniform(action_key, (*shape, env_spec.action_dim), minval=-1.0)
    terminated = jax.random.uniform(done_key, shape) < 0.001
    # Next-step autoreset: the row after a terminal holds the final observation.
    autoreset = jnp.pad(terminated[:, :-1], ((0, 0), (1, 0)))
    episode_start = jnp.pad(autoreset[:, :-1], ((0, 0), (1, 0)), constant_values=True)
    return replay.Rows(
        obs=obs,
        action=action,
        reward=jax.random.normal(reward_key, shape),
        terminated=terminated,
        truncated=jnp.zeros(shape, bool),
        autoreset=autoreset,
        episode_start=episode_start,
    )


def random_replay(algo: str, population_size: int, key, rows: int | None = None):
    """Per-member device buffers of `rows` rows each (None: `BENCH_REPLAY_ROWS`') filled with
    random data, and their spec."""
    env_spec = BENCH_SPECS[algo]
    rows = rows or BENCH_REPLAY_ROWS[algo]
    spec = replay.make_replay_spec(env_spec, capacity=rows, lanes=1, chunk_len=rows)
    state = replay.init_population(spec, population_size)
    chunks = jax.vmap(lambda k: random_rows(spec, env_spec, k))(
        jax.random.split(key, population_size)
    )
    state = jax.jit(jax.vmap(partial(replay.add, spec)))(state, chunks)
    return spec, state

"""A single-process population trainer: env stepping, replay and updates in one loop.

No collector processes: the learner steps the environments itself. It is the reference loop for
learning tests and small experiments; the multiprocess trainer moves the stepping out.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population, replay
from fastpop.agents import Agent
from fastpop.collect.evaluator import evaluate_population
from fastpop.envs import env_spec_from_spaces, make_vector_env
from fastpop.rollout import RowStream
from fastpop.types import PyTree


class InProcessResult(NamedTuple):
    states: PyTree  # stacked member states
    episode_returns: list[list[float]]  # per member, training episodes in order
    updates: int  # updates per member
    evaluations: list[tuple[int, np.ndarray]]  # (env steps per env, mean return per member)


def train_in_process(
    agent: Agent,
    env_id: str,
    hparams: PyTree,
    *,
    env_steps: int,
    warmup_steps: int,
    seed: int = 0,
    envs_per_member: int = 1,
    updates_per_step: float = 1.0,
    chunk_len: int = 10,
    replay_capacity: int = 100_000,
    execution: str = "vectorized",
    eval_interval: int | None = None,
    eval_episodes: int = 5,
) -> InProcessResult:
    """Train a population for `env_steps` steps per env; member i owns envs i*E .. i*E+E-1.

    With `eval_interval`, every member is evaluated (policy held constant) each time that many
    steps have passed and at the end.
    """
    size = population.population_size(hparams)
    num_envs = size * envs_per_member
    envs = make_vector_env(env_id, num_envs, seed)
    env_spec = env_spec_from_spaces(envs.single_observation_space, envs.single_action_space)
    spec = replay.make_replay_spec(env_spec, replay_capacity, envs_per_member, chunk_len)
    buffers = replay.init_population(spec, size)
    add = jax.jit(jax.vmap(lambda b, c: replay.add(spec, b, c)), donate_argnums=0)
    updates_per_chunk = max(1, round(chunk_len * envs_per_member * updates_per_step))
    sample_batch = lambda buffer, key: replay.sample(spec, buffer, key, agent.batch_size)
    unroll = population.scan_unroll(env_spec.obs_shape, updates_per_chunk)
    executor = population.make_executor(
        execution, agent, sample_batch, updates_per_chunk, unroll=unroll
    )
    act = jax.jit(population.population_act(agent))

    key = jax.random.key(seed)
    init_key, key = jax.random.split(key)
    states = executor.adopt(population.init_population(agent, init_key, hparams))
    member_hparams = executor.adopt(hparams)
    stream = RowStream(spec, num_envs)
    returns: list[list[float]] = [[] for _ in range(size)]
    obs, _ = envs.reset(seed=seed)
    updates = 0
    evaluations = []
    policy = population.member_policies(agent, executor.release(states))
    for step in range(env_steps):
        if step < warmup_steps:
            actions = envs.action_space.sample()
        else:
            key, act_key = jax.random.split(key)
            member_obs = obs.reshape(size, envs_per_member, *obs.shape[1:])
            member_actions = act(
                policy, member_obs, jax.random.split(act_key, size), hparams, True, step
            )
            actions = np.asarray(member_actions).reshape(num_envs, *member_actions.shape[2:])
        next_obs, reward, terminated, truncated, _ = envs.step(actions)
        for lane, episode_return, _ in stream.append(obs, actions, reward, terminated, truncated):
            returns[lane // envs_per_member].append(episode_return)
        obs = next_obs
        if stream.has_chunk():
            chunk = stream.pop_chunk()
            chunk = jax.tree.map(
                lambda x: jnp.asarray(x).reshape(size, envs_per_member, *x.shape[1:]), chunk
            )
            buffers = add(buffers, chunk)
            if step + 1 >= warmup_steps:
                key, update_key = jax.random.split(key)
                states, _ = executor.update(
                    states, executor.adopt(buffers), member_hparams, update_key
                )
                updates += updates_per_chunk
                policy = population.member_policies(agent, executor.release(states))
        if eval_interval and ((step + 1) % eval_interval == 0 or step + 1 == env_steps):
            member_returns = evaluate(
                agent, executor.release(states), hparams, env_id, eval_episodes, seed + step + 1
            )
            evaluations.append((step + 1, member_returns))
    envs.close()
    return InProcessResult(executor.release(states), returns, updates, evaluations)


def evaluate(
    agent: Agent, states: PyTree, hparams: PyTree, env_id: str, episodes: int, seed: int
) -> np.ndarray:
    """Mean return of each member over `episodes` episodes with the policy held constant."""
    policy = population.member_policies(agent, states)
    return evaluate_population(agent, policy, hparams, env_id, episodes, seed)[0]

"""A run without worker processes: the same `Learner` (replay, rate limiter, updates, strategy
steps) driven synchronously by environments stepped in this process.

Deterministic for a config and seed (no process timing decides what is inserted when), so it is
what the learning tests use, and a way to try a config from Python:

    result = train_in_process(load_config("configs/td3_pendulum_cpu.yaml"))

`fastpop train` moves the stepping into collector processes and evaluates asynchronously; the
learner it drives is this one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop import population
from fastpop.collect.evaluator import evaluate_population
from fastpop.collect.lockstep_envs import LockstepEnvs
from fastpop.collect.rows import RowStream
from fastpop.envs import make_vector_env
from fastpop.learn.learner import Learner
from fastpop.run.parts import build_learner
from fastpop.strategies.base import Evaluation
from fastpop.types import PyTree


class InProcessResult(NamedTuple):
    states: PyTree  # stacked member states
    episode_returns: list[list[float]]  # per member, training episodes in order
    updates: int  # updates per member
    evaluations: list[tuple[int, np.ndarray]]  # (env steps per member, mean return per member)
    learner: Learner


def train_in_process(config: config_lib.Config) -> InProcessResult:
    """Train for `train.total_env_steps` per member; member m owns envs m*E .. m*E+E-1. Every
    `eval.interval` env steps per member (and at the end) each member is evaluated with the
    policy held constant and the round goes to the strategy. A member's warm-up and exploration
    count its trial's env steps (halving's fresh trials start over, in new episodes)."""
    learner = build_learner(config)
    size, per_member = config.population.size, config.collect.envs_per_member
    num_envs = size * per_member
    atari = config_lib.atari_options(config)
    envs = LockstepEnvs(make_vector_env(config.env.id, num_envs, config.seed, atari=atari))
    stream = RowStream(learner.replay.spec, num_envs)
    # The keys split inside the policy's call: one dispatch per env step.
    step_policy = jax.jit(population.policy_step(learner.agent, size, per_member))
    key = jax.random.key(config.seed + 1)
    returns: list[list[float]] = [[] for _ in range(size)]
    evaluations: list[tuple[int, np.ndarray]] = []
    interval = learner.strategy.evaluation_interval
    steps_per_env = -(-config.train.total_env_steps // per_member)
    warmup_steps = -(-config.collect.warmup_steps // per_member)
    trial_steps = np.zeros(size, np.int64)  # per env, of each member's trial
    policy = learner.training.policies(learner.states)
    obs = envs.reset(seed=config.seed)
    for step in range(steps_per_env):
        warming = trial_steps < warmup_steps
        if warming.all():
            actions = envs.action_space.sample()
        else:
            member_obs = obs.reshape(size, per_member, *obs.shape[1:])
            chosen, key = step_policy(policy, member_obs, key, learner.hparams, trial_steps)
            actions = np.asarray(chosen).reshape(num_envs, *chosen.shape[2:])
            if warming.any():
                lanes = np.repeat(warming, per_member).reshape(-1, *[1] * (actions.ndim - 1))
                actions = np.where(lanes, envs.action_space.sample(), actions)
        next_obs, reward, terminated, truncated = envs.step(actions)
        for lane, episode_return, _ in stream.append(obs, actions, reward, terminated, truncated):
            returns[lane // per_member].append(episode_return)
        obs, trial_steps = next_obs, trial_steps + 1
        if not stream.has_chunk():
            continue
        before = learner.limiter.inserted
        learner.insert(stream.pop_chunk())
        while learner.can_update():
            learner.update()
        done = step + 1 == steps_per_env
        if done or learner.limiter.inserted // interval > before // interval:
            mean = _evaluate(learner, config, atari, len(evaluations))
            evaluations.append((learner.limiter.inserted, mean))
            if not done:
                evaluation = Evaluation(len(evaluations) - 1, learner.limiter.inserted, mean)
                learner.strategy_step(evaluation)
                if (fresh := learner.clocks.restarting()).any():  # their next rows start them
                    trial_steps[fresh] = 0
                    obs, restarted = envs.restart(np.repeat(fresh, per_member), obs)
                    stream.restart_lanes(restarted)
        policy = learner.training.policies(learner.states)
    envs.close()
    states = learner.training.release(learner.states)
    return InProcessResult(states, returns, learner.updates, evaluations, learner)


def _evaluate(learner: Learner, config: config_lib.Config, atari, index: int) -> np.ndarray:
    policy = learner.training.policies(learner.states)
    seed = config.seed + 7919 * (index + 1)
    episodes = config.eval.episodes
    return evaluate_population(
        learner.agent, policy, learner.hparams, config.env.id, episodes, seed, atari=atari
    )[0]


def evaluate(agent, states: PyTree, hparams: PyTree, env_id: str, episodes: int, seed: int):
    """Mean return of each member over `episodes` episodes with the policy held constant."""
    policy = population.member_policies(agent, states)
    return evaluate_population(agent, policy, hparams, env_id, episodes, seed)[0]

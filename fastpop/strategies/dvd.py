"""DvD (Parker-Holder et al., NeurIPS 2020) over TD3: a shared critic, actors trained on the sum
of their TD3 losses minus lambda * log det K (see `shared_critic` and `diversity`), lambda chosen
online by a Thompson-sampling bandit rewarded when the population's best return improves.

Between rounds (every eval.interval env steps; the learner waits for each round's returns):
members with non-finite parameters restart from the best member (logged), the bandit picks the
next lambda, and the diversity of the population is measured for the logs.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.strategies import diversity, shared_critic
from fastpop.strategies.base import (
    DVD_STREAM,
    Evaluation,
    reset_events,
    reset_indices,
    stream_rng,
)


class BanditState(NamedTuple):
    successes: tuple[int, ...]  # per arm
    failures: tuple[int, ...]
    arm: int  # the arm in force since the last round
    best_return: float  # the population's best return at the last round (NaN before any)
    rounds: int


def bandit_init(arms: int) -> BanditState:
    return BanditState((0,) * arms, (0,) * arms, 0, math.nan, 0)


def bandit_step(state: BanditState, best_return: float, seed: int, adapt: bool) -> BanditState:
    """Reward the arm in force (1 if the best return improved), then draw the next arm from the
    Beta(1 + successes, 1 + failures) posteriors."""
    successes, failures = list(state.successes), list(state.failures)
    if math.isfinite(state.best_return) and math.isfinite(best_return):
        improved = best_return > state.best_return
        (successes if improved else failures)[state.arm] += 1
    arm = state.arm
    if adapt:
        rng = stream_rng(seed, DVD_STREAM, state.rounds)
        draws = rng.beta(1 + np.array(successes), 1 + np.array(failures))
        arm = int(np.argmax(draws))
    best = best_return if math.isfinite(best_return) else state.best_return
    return BanditState(tuple(successes), tuple(failures), arm, best, state.rounds + 1)


def make_dvd(size: int, config, seed: int, evaluation_interval: int):
    """`config`: a `DvDConfig`."""
    coefficients = tuple(float(c) for c in config.coefficients)
    adapt = config.adapt == "bandit"
    metrics_fn = jax.jit(
        lambda apply, actors, obs: diversity.diversity_metrics(
            apply, actors, obs, config.length_scale, config.jitter
        ),
        static_argnums=0,
    )

    def init_states(agent, key, hparams):
        states = shared_critic.init(agent, key, hparams, np.ones(size, bool))
        states = states._replace(diversity_weight=jnp.float32(coefficients[0]))
        return states, bandit_init(len(coefficients))

    def make_update(agent, sample_batch, num_updates, unroll):
        return shared_critic.make_update(
            agent,
            sample_batch,
            num_updates,
            config.embedding_states,
            config.length_scale,
            config.jitter,
            unroll,
        )

    def step(agent, bandit: BanditState, evaluation: Evaluation, states, observations, key):
        returns = np.asarray(evaluation.returns, np.float64)
        indices = reset_indices(evaluation.finite, returns)
        events = reset_events("dvd", evaluation, indices, returns)
        if events:
            members = population.gather(shared_critic.member_trees(states), jnp.asarray(indices))
            states = states._replace(
                actors=members[0], target_actors=members[1], actor_opts=members[2]
            )
        finite_returns = returns[np.isfinite(returns)]
        best = float(finite_returns.max()) if finite_returns.size else math.nan
        bandit = bandit_step(bandit, best, seed, adapt)
        weight = coefficients[bandit.arm]
        states = states._replace(diversity_weight=jnp.float32(weight))
        obs = observations(key)[: config.embedding_states]
        measured = metrics_fn(agent.parts.actor_apply, states.actors, obs)
        scalars = {f"dvd/{name}": float(value) for name, value in measured.items()}
        scalars["dvd/lambda"] = weight
        return bandit, states, scalars, events

    return shared_critic.strategy("dvd", evaluation_interval, init_states, make_update, step)

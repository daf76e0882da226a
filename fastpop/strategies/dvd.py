"""DvD (Parker-Holder et al., NeurIPS 2020) over TD3: a shared critic, actors trained on the sum
of their TD3 losses minus lambda * log det K (see `shared_critic` and `diversity`), lambda chosen
online by the authors' Thompson-sampling bandit (jparkerholder/DvD_ES, bandits.py): an arm is
rewarded when the population's mean return beats the best of 5 earlier rounds, the posteriors
are made of the latest 50 judged rounds, and the first 5 picks are uniform.

Between rounds (every eval.interval env steps; the learner waits for each round's returns):
members with non-finite parameters restart from the best member (logged), the bandit picks the
next lambda, and the diversity of the population is measured for the logs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.compilation.rarely_run import rarely_run_jit
from fastpop.schema import field
from fastpop.strategies import diversity, shared_critic
from fastpop.strategies.base import (
    DVD_STREAM,
    Evaluation,
    StrategyEntry,
    reset_events,
    reset_indices,
    stream_rng,
)

# The bandit of the authors' code (jparkerholder/DvD_ES, bandits.py, BayesianBandits):
BASELINE_ROUNDS = 5  # a round's value is judged against the best of 5 earlier ones (line 53)
WINDOW = 50  # judged rounds the posteriors are made of (lines 10, 59)
RANDOM_ROUNDS = 5  # rounds whose next arm is drawn uniformly, not by Thompson sampling (12, 28)


@dataclasses.dataclass(frozen=True)
class DvDConfig:
    coefficients: tuple[float, ...] = field((0.0, 0.5), min=0)
    """The bandit's arms: values of lambda, the weight of -log det K in the actor loss."""
    adapt: str = field("bandit", choices=("bandit", "fixed"))
    """bandit: Thompson sampling over `coefficients` as the authors' code does it (an arm is
    rewarded when the population's mean return beats the best of 5 earlier rounds; posteriors
    over the latest 50 judged rounds; the first 5 picks uniform); fixed: lambda = the first
    coefficient throughout."""
    embedding_states: int = field(20, min=2)
    """States in the shared batch whose actions make a member's behavioural embedding."""
    length_scale: float = field(1.0, gt=0)
    """RBF kernel length scale, on the mean squared action difference."""
    jitter: float = field(1e-3, gt=0)
    """Added to K's diagonal before the log-determinant."""


class BanditState(NamedTuple):
    """Plain numbers and tuples (checkpointed as JSON by `strategies.codec`).

    arm        the arm in force since the last round (arm 0 first: bandits.py line 19)
    rounds     rounds seen
    values     the bandit's value (`bandit_value`) of the latest BASELINE_ROUNDS + 1 rounds,
               oldest first
    feedback   (arm, reward) of the latest WINDOW judged rounds, oldest first: reward 1 if the
               round beat its baseline, 0.5 on a tie, 0 otherwise (bandits.py line 57)
    """

    arm: int
    rounds: int
    values: tuple[float, ...]
    feedback: tuple[tuple[int, float], ...]


def bandit_init() -> BanditState:
    """Arm 0 in force, no feedback: every arm's posterior is Beta(1, 1)."""
    return BanditState(0, 0, (), ())


def bandit_value(returns: np.ndarray) -> float:
    """What the bandit is fed each round: the population's mean return (train.py line 137,
    `reward = np.mean(rwds)`, fed at line 157), over the members whose return is finite."""
    finite = np.asarray(returns, np.float64)
    finite = finite[np.isfinite(finite)]
    return float(finite.mean()) if finite.size else math.nan


def bandit_posterior(state: BanditState, arms: int) -> tuple[tuple[float, ...], ...]:
    """(alpha, beta) per arm: Beta(1 + rewards, 1 + judged rounds - rewards) over the window."""
    rewards, counts = np.zeros(arms), np.zeros(arms)
    for arm, reward in state.feedback:
        rewards[arm] += reward
        counts[arm] += 1
    return tuple(float(a) for a in 1 + rewards), tuple(float(b) for b in 1 + counts - rewards)


def judge(state: BanditState, value: float) -> tuple[tuple[int, float], ...]:
    """The feedback window after this round's value: the arm in force since the last round is
    rewarded if `value` beats the best of the BASELINE_ROUNDS rounds before the last one (as
    bandits.py's `rolling(5).max().shift(1)` does), from the 7th round on (its first judged row
    is dropped, line 58); nothing when a value involved is not finite (pandas' NaN windows)."""
    if len(state.values) < BASELINE_ROUNDS + 1:
        return state.feedback
    baseline = state.values[:-1]
    if not all(math.isfinite(v) for v in (value, *baseline)):
        return state.feedback
    reward = (float(np.sign(value - max(baseline))) + 1) / 2
    return (*state.feedback, (state.arm, reward))[-WINDOW:]


def bandit_step(state: BanditState, value: float, arms: int, seed: int, adapt: bool) -> BanditState:
    """Judge the arm in force by this round's `value` (see `judge`), then pick the next arm:
    uniformly for the first RANDOM_ROUNDS rounds, then by Thompson sampling from the
    posteriors (`bandit_posterior`); always arm 0 unless `adapt`."""
    feedback = judge(state, value)
    values = (*state.values, value)[-(BASELINE_ROUNDS + 1) :]
    rounds = state.rounds + 1
    arm = state.arm
    if adapt:
        rng = stream_rng(seed, DVD_STREAM, state.rounds)
        if rounds <= RANDOM_ROUNDS:
            arm = int(rng.integers(arms))
        else:
            alpha, beta = bandit_posterior(state._replace(feedback=feedback), arms)
            arm = int(np.argmax(rng.beta(alpha, beta)))
    return BanditState(arm, rounds, values, feedback)


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
        # One program, not a slice and a squeeze per critic leaf shape run one by one.
        states = rarely_run_jit(functools.partial(initial_arrays, agent))(key, hparams)
        return states, bandit_init()

    def initial_arrays(agent, key, hparams):
        states = shared_critic.init(agent, key, hparams, np.ones(size, bool))
        return states._replace(diversity_weight=jnp.float32(coefficients[0]))

    def make_update(plan):
        return shared_critic.make_update(
            plan, config.embedding_states, config.length_scale, config.jitter
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
        bandit = bandit_step(bandit, bandit_value(returns), len(coefficients), seed, adapt)
        weight = coefficients[bandit.arm]
        states = states._replace(diversity_weight=jnp.float32(weight))
        obs = observations(key)[: config.embedding_states]
        measured = metrics_fn(agent.internals.actor_apply, states.actors, obs)
        scalars = {f"dvd/{name}": float(value) for name, value in measured.items()}
        scalars["dvd/lambda"] = weight
        return bandit, states, scalars, events

    return shared_critic.strategy("dvd", evaluation_interval, init_states, make_update, step)


def check_embedding(r, c) -> None:
    """The embedding states come from one sampled batch."""
    embedding_states = c.section("dvd").embedding_states
    if embedding_states > c.agent["batch_size"]:
        r.fail(
            "dvd.embedding_states",
            f"must be <= agent.batch_size ({c.agent['batch_size']}): the embedding states are "
            f"taken from one sampled batch, got {embedding_states}",
        )


ENTRY = StrategyEntry(
    name="dvd",
    make=lambda setting: make_dvd(
        setting.population.size, setting.section, setting.seed, setting.evaluation_interval
    ),
    config_type=DvDConfig,
    check=check_embedding,
    shared_critic=True,
    replayable=False,
)

"""Successive halving inside one population, asynchronous as in ASHA (Li et al., 2020).

Each member slot runs one trial at a time: hparams drawn from the priors, trained from scratch.
A trial's age is the env steps of the rows its own policy collected that went into its replay
(not the run's steps since the decision: rows of the stopped trial still on their way are not
its own; `learn/member_clocks.py`), counted at the snapshot its return comes from; rungs are ages
on a geometric schedule (`rung_schedule`). When a trial reaches a rung its return there is
recorded, and it is stopped if it is among the bottom `bottom_fraction` (by default ASHA's
1 - 1/reduction_factor) of every return recorded at that rung so far, itself included (a trial
arriving late is judged against all who came before, as ASHA judges it; the first arrivals, all
together, lose exactly the bottom fraction). A stopped trial's slot starts a fresh trial at once:
new hparams from the priors, new networks and optimizer state, its own replay emptied (its
updates wait until it holds `replay.min_size` rows again), a new trial id, and its exploration
schedules (warm-up, DQN's epsilon) counted from its own first step. A non-finite return ranks
last; a trial whose state is not finite is stopped and its slot starts a fresh trial (it keeps
no other trial's weights). Past the last rung, trials train on.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from fastpop.schema import field
from fastpop.strategies.base import (
    HALVING_STREAM,
    Evaluation,
    Selection,
    Strategy,
    StrategyEntry,
    stream_rng,
)
from fastpop.strategies.pbt import rank
from fastpop.strategies.priors import Prior


@dataclasses.dataclass(frozen=True)
class HalvingConfig:
    first_rung: int = field(10_000, min=1)
    """A trial's age (env steps per member since it started) at its first rung."""
    reduction_factor: float = field(3.0, gt=1)
    """Each rung is this many times older than the one before."""
    bottom_fraction: float | None = field(None, gt=0, max=1)
    """Share of the returns recorded at a rung whose trials are stopped there (in (0, 1));
    null: ASHA's 1 - 1/reduction_factor (2/3 at 3: the top third goes on to the next rung,
    which is reduction_factor times older)."""


def rung_schedule(
    first_rung: int, reduction_factor: float, total_env_steps: int
) -> tuple[int, ...]:
    """Trial ages (env steps per member) of the rungs: first_rung * reduction_factor**k below
    the run's total; empty when the first rung is not below it."""
    rungs, age = [], float(first_rung)
    while round(age) < total_env_steps:
        if not rungs or round(age) > rungs[-1]:
            rungs.append(round(age))
        age *= reduction_factor
    return tuple(rungs)


def stopped_at_rung(results: list[float], arrivals: list[int], bottom_fraction: float) -> set[int]:
    """Which of the `arrivals` (indices into `results`, the returns recorded at one rung, in
    the order they were recorded) rank among the bottom floor(fraction * n) of all n results."""
    order = rank(np.asarray(results, np.float64))  # best first, NaN last, ties: earlier first
    place = np.empty(len(results), int)
    place[order] = np.arange(len(results))
    cut = len(results) - math.floor(bottom_fraction * len(results))
    return {i for i in arrivals if place[i] >= cut}


class HalvingState(NamedTuple):
    trials: tuple[int, ...]  # per member slot: the id of the trial it runs
    passed: tuple[int, ...]  # per member slot: rungs its trial has reached
    results: tuple[tuple[tuple[int, float], ...], ...]  # per rung: (trial, return) recorded
    next_trial: int


class HalvingSettings(NamedTuple):
    rungs: tuple[int, ...]  # trial ages, `rung_schedule`
    bottom_fraction: float  # of the returns recorded at a rung, whose trials are stopped
    evaluation_interval: int


def asha_bottom_fraction(reduction_factor: float) -> float:
    """ASHA's share of a rung's trials stopped there: all but the top 1/eta."""
    return 1.0 - 1.0 / reduction_factor


def trials_at_rungs(state: HalvingState, evaluation: Evaluation, rungs) -> list[int]:
    """The members whose evaluated policy is their current trial's and whose trial, at the
    snapshot, had trained for the age of its next rung. A snapshot taken before the slot's
    trial started (the result came back after a strategy step started it) is the stopped
    trial's policy: it counts for no trial."""
    size = len(state.trials)
    ages = evaluation.trial_steps
    if ages is None:  # not filled in by a learner: no trial has restarted
        ages = np.full(size, evaluation.member_env_steps)
    current = evaluation.same_line
    return [
        m
        for m in range(size)
        if current[m] and state.passed[m] < len(rungs) and ages[m] >= rungs[state.passed[m]]
    ]


class RungJudgement(NamedTuple):
    """One evaluation's trials at their rungs: `results` per rung with theirs recorded,
    `where` (member -> (rung, index of its result there)) and the members `stopped`: those in
    the bottom fraction at their rung, and those whose state is not finite (`finite`)."""

    arrived: list[int]
    results: list[list[tuple[int, float]]]
    where: dict[int, tuple[int, int]]
    stopped: set[int]
    finite: np.ndarray


def judge_at_rungs(
    state: HalvingState, evaluation: Evaluation, settings: HalvingSettings
) -> RungJudgement:
    """The returns of the trials that reached a rung recorded there, and who is stopped."""
    rungs, size = settings.rungs, len(state.trials)
    arrived = trials_at_rungs(state, evaluation, rungs)
    finite = np.ones(size, bool) if evaluation.finite is None else evaluation.finite
    stopped = {m for m in range(size) if not finite[m]}  # its weights now: no trial's
    results = [list(r) for r in state.results]
    results += [[] for _ in range(len(rungs) - len(results))]  # a resume ran the total up
    where = {}
    for member in arrived:
        rung = state.passed[member]
        where[member] = (rung, len(results[rung]))
        results[rung].append((state.trials[member], float(evaluation.returns[member])))
    for rung in {r for r, _ in where.values()}:
        mine = {i: m for m, (r, i) in where.items() if r == rung}
        returns = [value for _, value in results[rung]]
        losers = stopped_at_rung(returns, list(mine), settings.bottom_fraction)
        stopped |= {mine[i] for i in losers}
    return RungJudgement(arrived, results, where, stopped, finite)


def trial_event(
    judged: RungJudgement, evaluation: Evaluation, rungs, member: int, trials, hparams: list
) -> dict:
    """The lineage event of member `member`'s trial stopped and `trials` (stopped, new)
    started in its slot, `hparams` (old, new) its hparams; why: its rung or a non-finite
    state."""
    (stopped_trial, trial), (old_hparams, new_hparams) = trials, hparams
    event = {
        "strategy": "halving",
        "kind": "trial",
        "eval_index": evaluation.eval_index,
        "member_env_steps": evaluation.member_env_steps,
        "target": member,
        "source": member,
        "stopped_trial": stopped_trial,
        "trial": trial,
        "old_hparams": old_hparams,
        "new_hparams": new_hparams,
    }
    if member in judged.where:  # judged at a rung (a broken one too, if it reached one)
        rung = judged.where[member][0]
        event |= {
            "reason": "rung",
            "rung": rung,
            "rung_age": rungs[rung],
            "recorded_at_rung": len(judged.results[rung]),
            "target_fitness": float(evaluation.returns[member]),
        }
        if evaluation.trial_steps is not None:
            event["trial_steps"] = int(evaluation.trial_steps[member])  # its age at the snapshot
    if not judged.finite[member]:
        event["reason"] = "non_finite"
    return event


def make_halving(
    size: int, priors: dict[str, Prior], seed: int, settings: HalvingSettings
) -> Strategy:
    """Members start as trials 0..size-1 (their initial hparams, as `independent` gives them);
    each new trial draws every hparam with a prior from `stream_rng(seed, HALVING_STREAM, id)`.
    A trial's age is `Evaluation.trial_steps`: the env steps its own policy collected and the
    learner inserted (`learn/member_clocks.py`)."""
    rungs = settings.rungs

    def init() -> HalvingState:
        return HalvingState(tuple(range(size)), (0,) * size, ((),) * len(rungs), size)

    def step(state: HalvingState, evaluation: Evaluation, hparams: list[dict]):
        judged = judge_at_rungs(state, evaluation, settings)
        if not judged.arrived and not judged.stopped:
            return state, None
        trials, passed = list(state.trials), list(state.passed)
        new_hparams, events, next_trial = [dict(h) for h in hparams], [], state.next_trial
        for member in judged.arrived:
            passed[member] += 1
        for member in sorted(judged.stopped):
            rng = stream_rng(seed, HALVING_STREAM, next_trial)
            drawn = {name: prior.sample(rng) for name, prior in priors.items()}
            new_hparams[member] = {**hparams[member], **drawn}
            pair = (hparams[member], new_hparams[member])
            events.append(
                trial_event(judged, evaluation, rungs, member, (trials[member], next_trial), pair)
            )
            trials[member], passed[member] = next_trial, 0
            next_trial += 1
        results = tuple(tuple(r) for r in judged.results)
        new_state = HalvingState(tuple(trials), tuple(passed), results, next_trial)
        if not judged.stopped:
            return new_state, None
        fresh = np.isin(np.arange(size), sorted(judged.stopped))
        return new_state, Selection(np.arange(size), new_hparams, events, False, fresh)

    def labels(state: HalvingState) -> list[dict]:
        return [{"trial": trial} for trial in state.trials]

    return Strategy(
        "halving", settings.evaluation_interval, False, init, step, member_labels=labels
    )


def make_from_setting(setting) -> Strategy:
    """Halving with the rungs of the config's `halving:` section over its run length."""
    halving = setting.section
    eta = halving.reduction_factor
    rungs = rung_schedule(halving.first_rung, eta, setting.total_env_steps)
    bottom = halving.bottom_fraction
    bottom = asha_bottom_fraction(eta) if bottom is None else bottom
    settings = HalvingSettings(rungs, bottom, setting.evaluation_interval)
    return make_halving(setting.population.size, setting.priors, setting.seed, settings)


def check_halving(r, c) -> None:
    """A bottom fraction below 1 and a rung schedule that fits in the run."""
    halving, total = c.section("halving"), c.train.total_env_steps
    if halving.bottom_fraction is not None and halving.bottom_fraction >= 1:
        r.fail(
            "halving.bottom_fraction",
            f"must be in (0, 1): the share of a rung's trials stopped there, got "
            f"{halving.bottom_fraction}",
        )
    if not rung_schedule(halving.first_rung, halving.reduction_factor, total):
        r.fail(
            "halving.first_rung",
            f"the rung schedule is empty: the first rung ({halving.first_rung} env steps per "
            f"member) must be below train.total_env_steps ({total})",
        )


ENTRY = StrategyEntry(
    name="halving",
    make=make_from_setting,
    config_type=HalvingConfig,
    check=check_halving,
    needs_priors=True,
    fresh_trials=True,
    replayable=False,
)

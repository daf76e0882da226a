"""Population-based bandits (PB2; Parker-Holder et al., NeurIPS 2020): PBT whose explore step
is a GP bandit instead of random perturbation.

Ranking, exploit and the rounds are PBT's (`strategies.pbt`, full-state copies). At every
evaluation each member adds one observation: the hparams its evaluated policy trained with (in
the unit box of its priors, log scale where a prior is log-uniform) and the change of its return
since its previous evaluation (since its source's, when it copied that evaluated state), only
where the two evaluated policies are one line trained with those hparams throughout: a round
decided while the evaluator lagged changed members between their snapshots, and their change
would mix two members' states and two sets of hparams. At a round, a time-varying GP
(`strategies.gp`) is fitted to the latest `pb2.window` evaluations' observations, and each
replaced member takes the candidate of highest UCB, mean + kappa * std of the change predicted at
the current evaluation; the members that keep running and the choices made earlier in the round
count as pending, so a round's choices spread out. Hparams without a prior are the source's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from fastpop.schema import field
from fastpop.strategies import gp
from fastpop.strategies.base import Evaluation, Strategy, StrategyEntry
from fastpop.strategies.pbt import Explorer, PBTSettings, check_selection, make_pbt, settings_of
from fastpop.strategies.priors import Prior


@dataclasses.dataclass(frozen=True)
class PB2Config:
    window: int = field(10, min=1)
    """Latest evaluations whose observations (hparams, change of return) the GP is fitted to;
    its time-varying kernel weighs older ones less still. At most the newest 1,000 observations
    (whole evaluations) are used: a round's time grows with their cube."""


CANDIDATES = 1000  # random points of the unit box scored by UCB per choice (d <= ~10 hparams)
# Observations the GP is fitted to at most (the newest whole evaluations): a round's host time
# grows with their square and cube (256 members x 10 evaluations: ~37 s on 2 CPU cores).
MAX_GP_POINTS = 1000


class PB2State(NamedTuple):
    """Plain data, as a checkpoint keeps it exactly (an array would come back as float32)."""

    observations: tuple[tuple[float, ...], ...]  # (evaluation index, change of return, *unit
    # hparams) of each member over each evaluation interval, oldest first
    last_returns: tuple[float, ...]  # each member's line's latest return (NaN: none)
    last_versions: tuple[int, ...] = ()  # the member's version that return was taken at
    last_index: tuple[int, ...] = ()  # and the evaluation's index (-1: none)


def to_unit(prior: Prior, value: float) -> float:
    """Where `value` sits in the prior's box, in [0, 1]: log scale for log-uniform priors,
    the position among the sorted options for a choice."""
    if prior.kind == "choice":
        options = sorted(float(v) for v in prior.values)
        nearest = min(range(len(options)), key=lambda i: abs(options[i] - float(value)))
        return nearest / (len(options) - 1) if len(options) > 1 else 0.5
    low, high, value = float(prior.low), float(prior.high), float(value)
    if prior.kind == "log_uniform":
        low, high, value = math.log(low), math.log(high), math.log(max(value, 1e-300))
    return min(max((value - low) / (high - low), 0.0), 1.0)


def from_unit(prior: Prior, unit: float):
    """The inverse of `to_unit`, rounded to an option or an integer where the prior is one."""
    if prior.kind == "choice":
        options = sorted(prior.values, key=float)
        return options[round(unit * (len(options) - 1))]
    if prior.kind == "log_uniform":
        return prior.clip(math.exp(math.log(prior.low) + unit * math.log(prior.high / prior.low)))
    return prior.clip(prior.low + unit * (prior.high - prior.low))


def newest_within(observations: np.ndarray, limit: int) -> np.ndarray:
    """The observations (rows of (evaluation index, ...)) of the newest whole evaluations that
    number at most `limit`; the newest evaluation's alone when it has more."""
    times = observations[:, 0]
    for start in np.unique(times):  # oldest first
        if np.count_nonzero(times >= start) <= limit:
            return observations[times >= start]
    return observations[times == times.max()]


def ucb_kappa(observations: int) -> float:
    """The exploration weight Ray Tune's PB2 uses, growing slowly with the data."""
    return math.sqrt(0.2 + max(0.0, math.log(0.4 * max(observations, 1))))


def choose_configurations(model: gp.Fit, now: int, pending: np.ndarray, count: int, rng):
    """`count` points of the unit box, one after another, each the best UCB among random
    candidates with the pending points and the earlier choices counted as observed (each
    choice extends the fit by one point: pending points leave the mean as it was)."""
    dims, kappa = pending.shape[1], ucb_kappa(len(model.x))
    known = gp.with_pending(model, pending, np.full(len(pending), float(now)))
    chosen = []
    for index in range(count):
        candidates = rng.uniform(size=(CANDIDATES, dims))
        mean, std = gp.predict(known, candidates, np.full(CANDIDATES, float(now)))
        best = int(np.argmax(mean + kappa * std))
        chosen.append((candidates[best], mean[best] + kappa * std[best], mean[best], std[best]))
        if index + 1 < count:
            known = gp.with_pending(known, candidates[best][None], np.full(1, float(now)))
    return chosen


def snapshot_versions(evaluation: Evaluation) -> np.ndarray:
    """(P,) each member's version at the snapshot (-1 where none are given: a strategy stepped
    without a learner, whose rounds act on the members as evaluated)."""
    if evaluation.versions is None:
        return np.full(len(evaluation.returns), -1, np.int64)
    return np.asarray(evaluation.versions, np.int64)


def continued_bases(state: PB2State, evaluation: Evaluation, exploits) -> PB2State:
    """Where a copied state is exactly the evaluated one (no update or change since the
    snapshot: the learner waited, or the round came at once), the target's next change counts
    from its source's return, as PB2 measures it; its version after the copy is its version now
    plus one (the learner counts each change of a member once). Otherwise the new line has no
    evaluation yet, and the target's base stays its old line's: snapshots of that line taken
    before the copy are still to come back."""
    exact, now = evaluation.as_evaluated, evaluation.versions_now
    returns, versions, index = (list(field) for field in state[1:])
    for target, source in exploits:
        if exact is None or exact[source]:
            returns[target], index[target] = state.last_returns[source], state.last_index[source]
            versions[target] = -1 if now is None else int(now[target]) + 1
    return state._replace(
        last_returns=tuple(returns), last_versions=tuple(versions), last_index=tuple(index)
    )


def gp_bandit(size: int, priors: dict[str, Prior], window: int) -> Explorer:
    names = sorted(priors)

    def unit_point(hparams: dict) -> list[float]:
        return [to_unit(priors[name], hparams[name]) for name in names]

    def init() -> PB2State:
        return PB2State((), (math.nan,) * size, (-1,) * size, (-1,) * size)

    def observe(state: PB2State, evaluation: Evaluation, hparams: list[dict]) -> PB2State:
        returns = np.asarray(evaluation.returns, np.float64)
        now, last = evaluation.eval_index, np.asarray(state.last_returns, np.float64)
        versions = snapshot_versions(evaluation)
        one_line = (np.asarray(state.last_index) == now - 1) & (
            np.asarray(state.last_versions) == versions
        )
        evaluated = hparams if evaluation.hparams is None else evaluation.hparams
        added = tuple(
            (float(now), float(returns[m] - last[m]), *unit_point(evaluated[m]))
            for m in np.flatnonzero(np.isfinite(returns) & np.isfinite(last) & one_line)
        )
        recent = tuple(o for o in state.observations + added if o[0] > now - window)
        return PB2State(
            recent, tuple(float(r) for r in returns), tuple(versions.tolist()), (now,) * size
        )

    def choose(state: PB2State, evaluation: Evaluation, exploits, hparams, rng):
        state = continued_bases(state, evaluation, exploits)
        if not exploits:
            return state, []
        if not state.observations:  # nothing observed yet: draw from the priors
            draws = [{n: priors[n].sample(rng) for n in names} for _ in exploits]
            return state, [(draw, {"acquisition": None}) for draw in draws]
        targets = {exploit.target for exploit in exploits}
        running = np.array([unit_point(hparams[m]) for m in range(size) if m not in targets])
        observations = newest_within(np.array(state.observations), MAX_GP_POINTS)
        model = gp.fit(observations[:, 2:], observations[:, 0], observations[:, 1])
        now = evaluation.eval_index
        picks = choose_configurations(
            model, now, running.reshape(-1, len(names)), len(exploits), rng
        )
        choices = []
        for point, acquisition, mean, std in picks:
            values = {
                name: from_unit(priors[name], u) for name, u in zip(names, point, strict=True)
            }
            extra = {
                "acquisition": float(acquisition),
                "predicted_change": float(mean),
                "predicted_std": float(std),
            }
            choices.append((values, extra))
        return state, choices

    return Explorer("pb2", init, observe, choose)


def make_pb2(
    size: int, priors: dict[str, Prior], seed: int, settings: PBTSettings, window: int
) -> Strategy:
    """PBT (`settings`: interval, fractions, fitness window, replay) with PB2's explore over
    the observations of the latest `window` evaluations."""
    return make_pbt(size, priors, seed, settings, gp_bandit(size, priors, window))


def make_from_setting(setting) -> Strategy:
    """PB2 with the config's `pbt:` rounds and selection and its `pb2:` window."""
    settings = settings_of(setting.sections["pbt"], setting.evaluation_interval)
    size, window = setting.population.size, setting.section.window
    return make_pb2(size, setting.priors, setting.seed, settings, window)


ENTRY = StrategyEntry(
    name="pb2",
    make=make_from_setting,
    config_type=PB2Config,
    check=check_selection,
    needs_priors=True,
    wait_option="pbt.wait",
)

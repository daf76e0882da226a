"""Population-based training (Jaderberg et al., 2017): truncation selection, exploit, explore.

Selection and exploration are host-side arithmetic on a handful of numbers per member; exploit
is one index gather over the whole stacked member state on device (networks, targets,
optimizer moments, step counters), so a copied member is the source member, not just its actor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fastpop.schema import field
from fastpop.strategies.base import (
    PBT_STREAM,
    Evaluation,
    Selection,
    Strategy,
    StrategyEntry,
    stream_rng,
)
from fastpop.strategies.priors import Prior


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    interval: int = field(50_000, min=1)
    """Env steps per member between exploit/explore rounds (each on the next evaluation)."""
    bottom_fraction: float = field(0.25, gt=0, max=1)
    """Share of members (ranked by fitness) that copy a member from the top."""
    top_fraction: float = field(0.25, gt=0, max=1)
    """Share of members the copied-from member is drawn from."""
    perturb_factors: tuple[float, ...] = field((0.8, 1.2), gt=0)
    """Explore multiplies each copied hparam by one of these, drawn uniformly."""
    resample_probability: float = field(0.25, min=0, max=1)
    """Chance that explore resamples an hparam from its prior instead of perturbing it."""
    fitness_window: int = field(1, min=1)
    """Evaluations averaged into a member's fitness (its latest ones since it last copied,
    after its last NaN return: a member reset after a NaN is judged on what it did since)."""
    replay: str = field("keep", choices=("keep", "copy"))
    """keep: a copying member keeps its own buffer; copy: it takes the source's buffer too."""
    wait: bool = False
    """The learner makes no update while an evaluation is pending, so a round acts on the
    policies it ranked, not on ones trained further meanwhile (Ray Tune's synchronous PBT);
    false: updates go on while the evaluator works and a round lands when its result arrives
    (asynchronous: no waiting, but the last rounds of a short run may come after training ends)."""


class Exploit(NamedTuple):
    target: int
    source: int


def rank(fitness: np.ndarray) -> np.ndarray:
    """Members from best to worst; non-finite fitness ranks last; ties keep member order."""
    fitness = np.asarray(fitness, np.float64)
    keyed = np.where(np.isfinite(fitness), -fitness, np.inf)
    return np.argsort(keyed, kind="stable")


def selection_sizes(size: int, bottom_fraction: float, top_fraction: float) -> tuple[int, int]:
    """(members replaced, members copied from); refuses fractions that select nobody."""
    if size < 2:
        raise ValueError(f"PBT needs a population of at least 2 members, got {size}")
    bottom, top = math.floor(bottom_fraction * size), math.floor(top_fraction * size)
    if bottom < 1 or top < 1:
        raise ValueError(
            f"pbt.bottom_fraction {bottom_fraction} and pbt.top_fraction {top_fraction} of "
            f"{size} members select {bottom} to replace and {top} to copy from; both must be "
            f">= 1 member (raise the fractions to at least {1 / size:.3g})"
        )
    if bottom + top > size:
        raise ValueError(
            f"pbt.bottom_fraction + pbt.top_fraction must be <= 1, got "
            f"{bottom_fraction} + {top_fraction}"
        )
    return bottom, top


def truncation_selection(
    fitness: np.ndarray, bottom_fraction: float, top_fraction: float, rng: np.random.Generator
) -> list[Exploit]:
    """The bottom members each copy a member drawn uniformly from the top ones.

    A member with non-finite fitness is always replaced, even beyond the bottom fraction.
    """
    fitness = np.asarray(fitness, np.float64)
    order = rank(fitness)
    bottom, top = selection_sizes(len(fitness), bottom_fraction, top_fraction)
    broken = int(np.sum(~np.isfinite(fitness)))
    targets = order[len(order) - max(bottom, broken) :]
    sources = [member for member in order[:top] if np.isfinite(fitness[member])]
    if not sources:
        return []  # nobody to copy from: every member is broken
    picks = rng.integers(len(sources), size=len(targets))
    return [Exploit(int(t), int(sources[p])) for t, p in zip(targets, picks, strict=True)]


def explore(
    values: dict[str, float],
    priors: dict[str, Prior],
    rng: np.random.Generator,
    perturb_factors: tuple[float, float] = (0.8, 1.2),
    resample_probability: float = 0.25,
) -> dict[str, float]:
    """Each hparam with a prior is resampled (with `resample_probability`) or multiplied by one
    of `perturb_factors`; results stay inside the prior and integers stay integers."""
    explored = dict(values)
    for name, prior in priors.items():
        if rng.uniform() < resample_probability:
            explored[name] = prior.sample(rng)
        else:
            factor = perturb_factors[int(rng.integers(len(perturb_factors)))]
            perturbed = values[name] * factor
            if prior.integer and round(perturbed) == values[name]:
                # x0.8 / x1.2 of a small integer rounds back to itself: move by one instead.
                perturbed = values[name] + (1 if factor > 1 else -1)
            explored[name] = prior.clip(perturbed)
        if prior.integer:
            explored[name] = int(explored[name])
    return explored


class PBTState(NamedTuple):
    next_round: int  # member env steps at which the next exploit/explore round is due
    rounds: int  # rounds done
    history: tuple[tuple[float, ...], ...]  # per member: its latest returns, oldest first
    explorer: Any = ()  # the explorer's own state (PB2's observations)


class Explorer(NamedTuple):
    """How a replaced member's new hparams are chosen: PBT perturbs or resamples the source's
    (`perturbing`), PB2 asks a GP bandit (`strategies.pb2`).

    init() -> state
    observe(state, evaluation, hparams) -> state       at every evaluation round
    choose(state, evaluation, exploits, hparams, rng) -> (state, [(values, extra lineage)])
        one entry per exploit: the explored hparams (those with a prior) of its target
    `hparams` are the members' now (what a copy continues with); the evaluated policies'
    are `evaluation.hparams`.
    """

    name: str
    init: Callable[[], Any]
    observe: Callable
    choose: Callable


def since_last_non_finite(returns: tuple[float, ...]) -> tuple[float, ...]:
    """The returns after the last non-finite one (all of them when every one is finite)."""
    broken = [i for i, value in enumerate(returns) if not math.isfinite(value)]
    return returns[broken[-1] + 1 :] if broken else returns


def fitness(history: tuple[tuple[float, ...], ...]) -> np.ndarray:
    """Mean of each member's window after its last non-finite return; NaN when its latest
    return is not finite (it ranks last and is replaced).

    A NaN return means the member's state was not finite, and the learner reset it from the
    best member's state: the returns before the NaN belong to a state it no longer has, so they
    must not keep it last for the rest of the window.
    """
    recent = [since_last_non_finite(h) for h in history]
    return np.array([np.mean(r) if r else np.nan for r in recent], np.float64)


class PBTSettings(NamedTuple):
    """When PBT decides and how (the config's `pbt` section and eval.interval)."""

    interval: int  # env steps per member between exploit/explore rounds
    evaluation_interval: int  # env steps per member between evaluations
    bottom_fraction: float = 0.25  # of the members, replaced each round
    top_fraction: float = 0.25  # of the members, copied from
    perturb_factors: tuple[float, ...] = (0.8, 1.2)
    resample_probability: float = 0.25  # an hparam is drawn from its prior, not perturbed
    fitness_window: int = 1  # latest returns averaged into a member's fitness
    copy_replay: bool = False  # a replaced member's replay becomes a copy of its source's
    wait: bool = False  # the learner pauses until each evaluation's results are in


def perturbing(priors: dict[str, Prior], settings: PBTSettings) -> Explorer:
    """PBT's explore: each hparam with a prior perturbed or resampled (`explore`)."""

    def choose(state, evaluation, exploits, hparams, rng):
        choices = []
        for exploit in exploits:
            source_values = {name: hparams[exploit.source][name] for name in priors}
            explored = explore(
                source_values, priors, rng, settings.perturb_factors, settings.resample_probability
            )
            choices.append((explored, {}))
        return state, choices

    return Explorer("pbt", lambda: (), lambda state, evaluation, hparams: state, choose)


def make_pbt(
    size: int,
    priors: dict[str, Prior],
    seed: int,
    settings: PBTSettings,
    explorer: Explorer | None = None,
) -> Strategy:
    """Every `settings.interval` env steps per member (on the first evaluation at or after
    it), the bottom members copy a top member's whole state and explore its hparams."""
    interval, fitness_window = settings.interval, settings.fitness_window
    bottom_fraction, top_fraction = settings.bottom_fraction, settings.top_fraction
    selection_sizes(size, bottom_fraction, top_fraction)  # refuses what selects nobody
    explorer = explorer or perturbing(priors, settings)

    def init() -> PBTState:
        return PBTState(interval, 0, ((),) * size, explorer.init())

    def step(state: PBTState, evaluation: Evaluation, hparams: list[dict]):
        # A member changed since the snapshot (a round decided meanwhile) holds another line
        # now: the evaluated policy's return is not its line's, so its history keeps without it.
        same = evaluation.same_line
        history = tuple(
            (*h, float(r))[-fitness_window:] if same[m] else h
            for m, (h, r) in enumerate(zip(state.history, evaluation.returns, strict=True))
        )
        observed = explorer.observe(state.explorer, evaluation, hparams)
        if evaluation.member_env_steps < state.next_round:
            return state._replace(history=history, explorer=observed), None
        scores = fitness(history)
        rng = stream_rng(seed, PBT_STREAM, state.rounds)
        exploits = truncation_selection(scores, bottom_fraction, top_fraction, rng)
        observed, choices = explorer.choose(observed, evaluation, exploits, hparams, rng)
        sources, new_hparams, events = np.arange(size), [dict(h) for h in hparams], []
        history = list(history)
        for (target, source), (explored, extra) in zip(exploits, choices, strict=True):
            sources[target] = source
            new_hparams[target] = {**hparams[source], **explored}
            history[target] = history[source]  # it is the source's state now
            events.append(
                {
                    "strategy": explorer.name,
                    "kind": "exploit",
                    "round": state.rounds,
                    "eval_index": evaluation.eval_index,
                    "member_env_steps": evaluation.member_env_steps,
                    "target": target,
                    "source": source,
                    "target_fitness": scores[target],
                    "source_fitness": scores[source],
                    "old_hparams": hparams[target],
                    "new_hparams": new_hparams[target],
                    **extra,
                }
            )
        next_round = state.next_round
        while next_round <= evaluation.member_env_steps:
            next_round += interval
        new_state = PBTState(next_round, state.rounds + 1, tuple(history), observed)
        return new_state, Selection(sources, new_hparams, events, settings.copy_replay)

    return Strategy(explorer.name, settings.evaluation_interval, settings.wait, init, step)


def settings_of(pbt: PBTConfig, evaluation_interval: int) -> PBTSettings:
    """The `PBTSettings` of a config's `pbt:` section and evaluation interval."""
    return PBTSettings(
        pbt.interval,
        evaluation_interval,
        pbt.bottom_fraction,
        pbt.top_fraction,
        pbt.perturb_factors,
        pbt.resample_probability,
        pbt.fitness_window,
        copy_replay=pbt.replay == "copy",
        wait=pbt.wait,
    )


def check_selection(r, config) -> None:
    """`pbt:`'s fractions select at least one member to copy and one to copy from."""
    try:
        pbt = config.section("pbt")
        selection_sizes(config.population.size, pbt.bottom_fraction, pbt.top_fraction)
    except ValueError as error:
        r.fail("pbt", str(error))


ENTRY = StrategyEntry(
    name="pbt",
    make=lambda setting: make_pbt(
        setting.population.size,
        setting.priors,
        setting.seed,
        settings_of(setting.section, setting.evaluation_interval),
    ),
    config_type=PBTConfig,
    check=check_selection,
    needs_priors=True,
    wait_option="pbt.wait",
)

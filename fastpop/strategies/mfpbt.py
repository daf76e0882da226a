"""Multiple-Frequencies PBT (MF-PBT; Doulazmi et al., 2025, arXiv:2506.03225, code
WaelDLZ/MF-PBT): PBT's population split into sub-populations that evolve at different
frequencies, with an asymmetric migration between them.

Members are split into `len(frequencies)` contiguous sub-populations of equal size (member m is in
sub-population m // n). A round is due every `interval` env steps per member (the ready
interval, on the first evaluation at or after it, as PBT's); at round r (0 first) sub-population
i evolves when (r + 1) % frequencies[i] == 0. An evolving sub-population, ranked on its own:

- exploit: its bottom quarter copies its top quarter rank for rank (the best of the bottom
  copies the best, the worst the quarter-th best: no draw), state and hparams, and explores them
  (each hparam with a prior multiplied by one of `perturb_factors`);
- migration: each member of its third quarter, best first, takes the state of the best member
  of the other sub-populations not yet taken this round, when that member ranks above it in the
  whole population (then the next one). Its hparams are asymmetric: from a slower sub-population
  (a larger frequency) it takes the migrant's hparams; into a slower one from a faster one it
  takes those of its own sub-population's best member (hparams tuned greedily do not reach the
  slow sub-populations, their networks do); between equal frequencies it keeps its own. A
  migrant's hparams are not explored.

Every copy is from the states as they were at the round (one index gather on device, as PBT's).
This is the reference code's `genetics` (hpo/utils/mf_pbt_genetics.py) over fastpop's rounds.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from fastpop.schema import field
from fastpop.strategies.base import Evaluation, Selection, Strategy, StrategyEntry, stream_rng
from fastpop.strategies.pbt import explore, fitness, rank
from fastpop.strategies.priors import Prior

MFPBT_STREAM = 60  # its explore's numpy seeds (base.py's streams are 1-4)
QUARTERS = 4  # an evolving sub-population's ranks are cut in quarters (the paper's)


@dataclasses.dataclass(frozen=True)
class MFPBTConfig:
    frequencies: tuple[int, ...] = field((1, 10, 25, 50), min=1)
    """Per sub-population, the rounds between its evolutions (the paper's delta_i: it evolves
    at every delta_i-th ready interval); the population splits into this many sub-populations
    of equal size, each of at least 4 members (its quarters). Default: the paper's 1, 10, 25,
    50."""
    interval: int = field(50_000, min=1)
    """Env steps per member between rounds (the ready interval, t_ready): sub-population i
    evolves every frequencies[i] x interval. PBT's default; the paper's 1M is for PPO on brax
    with 1024 envs per member."""
    perturb_factors: tuple[float, ...] = field((0.8, 1.25), gt=0)
    """Explore multiplies each copied hparam by one of these, drawn uniformly (the paper's)."""
    resample_probability: float = field(0.0, min=0, max=1)
    """Chance that explore resamples an hparam from its prior instead of perturbing it (the
    paper never resamples)."""
    fitness_window: int = field(1, min=1)
    """Evaluations averaged into a member's fitness, as `pbt.fitness_window` (the paper: the
    latest one)."""
    replay: str = field("keep", choices=("keep", "copy"))
    """keep: a copying member keeps its own buffer; copy: it takes the source's buffer too."""
    wait: bool = False
    """The learner makes no update while an evaluation is pending, as `pbt.wait`."""


class MFPBTState(NamedTuple):
    next_round: int  # member env steps at which the next round is due
    rounds: int  # rounds done (those where no sub-population evolved included)
    history: tuple[tuple[float, ...], ...]  # per member: its latest returns, oldest first


def evolving(round_index: int, frequencies: tuple[int, ...]) -> list[bool]:
    """Per sub-population: does it evolve at round `round_index` (0 first)?"""
    return [(round_index + 1) % frequency == 0 for frequency in frequencies]


def subpopulation_size(size: int, subpopulations: int) -> int:
    """Members per sub-population; refuses sizes that do not split into quarters."""
    if subpopulations < 1:
        raise ValueError("mfpbt.frequencies must name at least one sub-population")
    per, left = divmod(size, subpopulations)
    if left or per < QUARTERS:
        raise ValueError(
            f"population.size ({size}) must split evenly into the {subpopulations} "
            f"sub-populations of mfpbt.frequencies, each of at least {QUARTERS} members (its "
            f"quarters); e.g. population.size={subpopulations * max(QUARTERS, per)}"
        )
    return per


class Parents(NamedTuple):
    """One round's decision, per member (all pre-round indices)."""

    network: np.ndarray  # (P,) whose state it continues from
    hparams: np.ndarray  # (P,) whose hparams (those with a prior) it takes
    explored: np.ndarray  # (P,) bool: they are perturbed
    kinds: list  # "exploit", "migrate" or None


def genetics(scores: np.ndarray, frequencies: tuple[int, ...], round_index: int) -> Parents:
    """The round's exploits and migrations of every evolving sub-population, from `scores`
    (fitness; non-finite ranks last)."""
    size, count = len(scores), len(frequencies)
    per, share = size // count, size // count // QUARTERS
    order = rank(scores)  # the whole population, best first
    position = np.empty(size, int)
    position[order] = np.arange(size)
    local = [[m for m in order if m // per == i] for i in range(count)]
    parents = Parents(np.arange(size), np.arange(size), np.zeros(size, bool), [None] * size)
    due = evolving(round_index, frequencies)
    for i in np.flatnonzero(due):
        for worse, better in zip(local[i][-share:], local[i][:share], strict=True):
            parents.network[worse] = parents.hparams[worse] = better
            parents.explored[worse], parents.kinds[worse] = True, "exploit"
    for i in np.flatnonzero(due):
        external = [m for m in order if m // per != i]
        for member in local[i][2 * share : 3 * share]:
            if not external or position[external[0]] > position[member]:
                continue  # it stays; a worse member of the quarter may still take it
            migrant = external.pop(0)
            parents.network[member], parents.kinds[member] = migrant, "migrate"
            own, theirs = frequencies[i], frequencies[migrant // per]
            if own < theirs:  # from a slower sub-population: its hparams too
                parents.hparams[member] = migrant
            elif own > theirs:  # into a slower one: the hparams of its own best
                parents.hparams[member] = local[i][0]
    return parents


class MFPBTSettings(NamedTuple):
    """When MF-PBT decides and how (the config's `mfpbt` section and eval.interval)."""

    frequencies: tuple[int, ...]
    interval: int
    evaluation_interval: int
    perturb_factors: tuple[float, ...] = (0.8, 1.25)
    resample_probability: float = 0.0
    fitness_window: int = 1
    copy_replay: bool = False
    wait: bool = False


def decide(parents, scores, hparams, priors, rng, settings) -> tuple[list[dict], list[dict]]:
    """(every member's hparams after the round, the lineage records of those moved)."""
    new_hparams, records = [dict(h) for h in hparams], []
    per = len(hparams) // len(settings.frequencies)
    for target in np.flatnonzero(parents.network != np.arange(len(hparams))):
        source, giver = int(parents.network[target]), int(parents.hparams[target])
        values = {name: hparams[giver][name] for name in priors}
        if parents.explored[target]:
            factors, resample = settings.perturb_factors, settings.resample_probability
            values = explore(values, priors, rng, factors, resample)
        new_hparams[target] = {**hparams[source], **values}
        records.append(
            {
                "kind": parents.kinds[target],
                "target": int(target),
                "source": source,
                "hparams_source": giver,
                "subpopulation": int(target) // per,
                "source_subpopulation": source // per,
                "target_fitness": scores[target],
                "source_fitness": scores[source],
                "old_hparams": hparams[target],
                "new_hparams": new_hparams[target],
            }
        )
    return new_hparams, records


def make_mfpbt(size: int, priors: dict[str, Prior], seed: int, settings: MFPBTSettings) -> Strategy:
    """Every `settings.interval` env steps per member (on the first evaluation at or after it)
    the sub-populations due evolve: exploit and explore inside, then migration (`genetics`)."""
    frequencies, window = tuple(settings.frequencies), settings.fitness_window
    per = subpopulation_size(size, len(frequencies))  # refuses what does not split

    def init() -> MFPBTState:
        return MFPBTState(settings.interval, 0, ((),) * size)

    def step(state: MFPBTState, evaluation: Evaluation, hparams: list[dict]):
        # As PBT's: a member changed since the snapshot keeps its history without the return.
        same = evaluation.same_line
        history = tuple(
            (*h, float(r))[-window:] if same[m] else h
            for m, (h, r) in enumerate(zip(state.history, evaluation.returns, strict=True))
        )
        if evaluation.member_env_steps < state.next_round:
            return state._replace(history=history), None
        next_round = state.next_round
        while next_round <= evaluation.member_env_steps:
            next_round += settings.interval
        scores = fitness(history)
        parents = genetics(scores, frequencies, state.rounds)
        rng = stream_rng(seed, MFPBT_STREAM, state.rounds)
        new_hparams, records = decide(parents, scores, hparams, priors, rng, settings)
        history = tuple(history[source] for source in parents.network)  # copies' are sources'
        new_state = MFPBTState(next_round, state.rounds + 1, history)
        if not records:
            return new_state, None
        round_facts = {
            "strategy": "mfpbt",
            "round": state.rounds,
            "eval_index": evaluation.eval_index,
            "member_env_steps": evaluation.member_env_steps,
        }
        events = [{**round_facts, **record} for record in records]
        selection = Selection(parents.network.copy(), new_hparams, events, settings.copy_replay)
        return new_state, selection

    def labels(state) -> list[dict]:
        return [{"subpopulation": m // per} for m in range(size)]

    return Strategy(
        "mfpbt", settings.evaluation_interval, settings.wait, init, step, member_labels=labels
    )


def settings_of(section: MFPBTConfig, evaluation_interval: int) -> MFPBTSettings:
    """The `MFPBTSettings` of a config's `mfpbt:` section and evaluation interval."""
    return MFPBTSettings(
        tuple(section.frequencies),
        section.interval,
        evaluation_interval,
        tuple(section.perturb_factors),
        section.resample_probability,
        section.fitness_window,
        copy_replay=section.replay == "copy",
        wait=section.wait,
    )


def check_split(r, config) -> None:
    """`mfpbt.frequencies` split `population.size` into sub-populations of whole quarters."""
    try:
        subpopulation_size(config.population.size, len(config.section("mfpbt").frequencies))
    except ValueError as error:
        r.fail("mfpbt.frequencies", str(error))


ENTRY = StrategyEntry(
    name="mfpbt",
    make=lambda setting: make_mfpbt(
        setting.population.size,
        setting.priors,
        setting.seed,
        settings_of(setting.section, setting.evaluation_interval),
    ),
    config_type=MFPBTConfig,
    check=check_split,
    needs_priors=True,
    wait_option="mfpbt.wait",
)

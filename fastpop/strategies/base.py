"""What a strategy is: host-side decisions between evaluations, applied by the learner on device.

A strategy is a NamedTuple of pure functions over plain data (like an Agent):

    init() -> state
    step(state, evaluation, hparams) -> (state, Selection | None)

`step` sees one evaluation round (every member's return with the policy held constant) and the
members' current hparams, and may answer with a `Selection`: member i continues from the state of
member `sources[i]` (an index gather over the whole stacked member state, done by the learner)
with hparams `hparams[i]`. Its randomness comes from a seed derived from the config's seed and
the round, so the same run decides the same way and a checkpointed state is plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

# Streams of numpy seeds derived from config.seed, one per use, so no two uses share draws.
PRIOR_STREAM = 1
PBT_STREAM = 2
DVD_STREAM = 3
HALVING_STREAM = 4


def stream_rng(seed: int, stream: int, *counters: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, *counters])


class Evaluation(NamedTuple):
    """One evaluation round as a strategy sees it.

    The round's result may arrive after the members have trained on (process mode's evaluator
    works while the learner updates, `pbt.wait: false`; halving never waits), and a strategy
    step in between may have changed a member. So the round carries what each member was at the
    snapshot (the policy evaluated) beside what it is now; the learner fills in every field left
    None from the members as they are (a round evaluated where the members stand)."""

    eval_index: int
    member_env_steps: int  # at the snapshot
    returns: np.ndarray  # (population,) mean return; NaN for a member with non-finite params
    finite: np.ndarray | None = None  # (population,) bool: the member's state is all finite now
    # At the snapshot: the hparams the evaluated policies trained with; each member's version
    # (strategy changes of its state or hparams so far, `Learner.clocks`); the env steps its
    # trial had trained on (rows its own policy collected: halving's trial ages); updates.
    hparams: list[dict] | None = None
    versions: np.ndarray | None = None
    trial_steps: np.ndarray | None = None
    updates: int | None = None
    # Now: each member's version, and whether its state and hparams are still exactly the
    # evaluated ones (no strategy change and no update since the snapshot).
    versions_now: np.ndarray | None = None
    as_evaluated: np.ndarray | None = None

    @property
    def same_line(self) -> np.ndarray:
        """(population,) bool: no strategy step has changed the member since the snapshot, so
        its state descends from the evaluated policy with the evaluated hparams (all True when
        the versions are not given)."""
        if self.versions is None or self.versions_now is None:
            return np.ones(len(self.returns), bool)
        return np.asarray(self.versions) == np.asarray(self.versions_now)


def reset_indices(finite: np.ndarray, returns: np.ndarray) -> np.ndarray:
    """indices[i] = the member whose state member i continues from: the best finite member for
    members whose state is not finite, itself otherwise (and itself when no member is usable)."""
    usable = finite & np.isfinite(returns)
    indices = np.arange(len(finite))
    if usable.any() and not finite.all():
        best = int(np.flatnonzero(usable)[np.argmax(returns[usable])])
        indices[~finite] = best
    return indices


def reset_events(strategy: str, evaluation: Evaluation, indices, returns) -> list[dict]:
    """Lineage records of the members that `indices` (see `reset_indices`) moves."""
    return [
        {
            "strategy": strategy,
            "kind": "reset",
            "eval_index": evaluation.eval_index,
            "member_env_steps": evaluation.member_env_steps,
            "target": int(target),
            "source": int(indices[target]),
            "target_fitness": returns[target],
            "source_fitness": returns[indices[target]],
        }
        for target in np.flatnonzero(indices != np.arange(len(indices)))
    ]


class Selection(NamedTuple):
    """A strategy's decision: member i takes the state of `sources[i]` and the hparams
    `hparams[i]`; `events` are the lineage records (target, source, old -> new hparams, ...)."""

    sources: np.ndarray
    hparams: list[dict]
    events: list[dict]
    copy_replay: bool = False
    fresh: np.ndarray | None = None  # (P,) bool: members that start over as new trials (new
    # networks and optimizer state, an empty replay of their own); their hparams are `hparams`

    @property
    def moves_state(self) -> bool:
        return not np.array_equal(self.sources, np.arange(len(self.sources)))


class Learning(NamedTuple):
    """For strategies whose members share parameters or a loss (CEM-RL, DvD): they own the
    learner's member state and its update, and change the state on device between rounds.

    init_states(agent, key, hparams) -> (states, strategy state)
    make_update(plan: population.UpdatePlan) -> update(states, replay, hparams, key)
    policies(states) -> stacked policy params (what collectors and the evaluator act with)
    member_trees(states) -> the per-member (stacked) part of the state, checked for finiteness
    step(agent, strategy_state, evaluation, states, observations, key)
        -> (strategy_state, states, scalars to log, events)
        `observations(key)` samples a batch of states from the replay (for embeddings).
    """

    init_states: Callable
    make_update: Callable
    policies: Callable
    member_trees: Callable
    step: Callable


class Strategy(NamedTuple):
    name: str
    evaluation_interval: int  # env steps per member between evaluation rounds
    waits_for_evaluation: bool  # the learner pauses until each round's results are in
    init: Callable[[], Any]
    step: Callable[[Any, Evaluation, list[dict]], tuple[Any, Selection | None]]
    learning: Learning | None = None  # shared-parameter strategies (cemrl, dvd)
    member_labels: Callable[[Any], list[dict]] | None = None  # per member, fields its
    # metrics rows and members.json carry (halving: {"trial": id}); None: none
    entry: StrategyEntry | None = None  # its registry entry, set by `make_strategy` (never by
    # its factory): what is known of it before a run is built is read there, and only there

    @property
    def acts_on_evaluations(self) -> bool:
        """Its entry's `StrategyEntry.acts_on_evaluations` (false: its steps change nothing, so
        an evaluation may come back whenever it is ready without changing what the run trains);
        True for a strategy made without the registry (a test's), the side that waits."""
        return True if self.entry is None else self.entry.acts_on_evaluations


def no_selection(state, evaluation: Evaluation, hparams: list[dict]):
    """`Strategy.step` of strategies that act through `Learning.step` instead."""
    return state, None


class StrategySetting(NamedTuple):
    """What a strategy's factory reads of a run's config (`config.build.strategy_setting`): its
    own section and the run's shape, not the whole `Config`."""

    section: Any
    """Its config section (an instance of its entry's `config_type`; None: it has none)."""
    sections: Mapping[str, Any]
    """Every registered strategy's section by name (pb2 reads `pbt:`'s rounds)."""
    population: Any
    """The `population:` section (size, grid, priors as written, seeds)."""
    priors: dict
    """population.priors, parsed (`priors.parse_prior`)."""
    hparams: dict
    """The hparams every member starts from (`config.hparams`)."""
    seed: int
    evaluation_interval: int
    """Env steps per member between evaluation rounds (`eval.interval`)."""
    total_env_steps: int
    """Env steps per member of the whole run (`train.total_env_steps`)."""


class MeanMember(NamedTuple):
    """A member that is the population's search mean (`StrategyEntry.mean_member`)."""

    index: int
    label: str
    """What it is, in words ("CEM mean")."""


class StrategyEntry(NamedTuple):
    """Everything fastpop needs to know about one strategy (`strategies/registry.py` lists them):
    each strategy's module defines its entry next to its factory. Code elsewhere reads these
    fields, never a strategy's name."""

    name: str
    """What `strategy:` in a config names it by."""
    make: Callable[[StrategySetting], Strategy]
    """The factory: make(setting) builds it from its section and the run's shape."""
    config_type: type | None = None
    """Frozen dataclass of its config section, written at the top level of a preset under the
    strategy's name (`pbt:`, `halving:`, ...; `Config.section(name)`); None: it has none (it
    may read another's: pb2 reads `pbt:` too)."""
    check: Callable[[Any, Any], None] | None = None
    """check(reader, config): what its section and population need of the rest of the config,
    run after the checks its flags below imply; reader.fail(dotted, problem) refuses."""
    resolve_section: Callable[[Any, Any, dict, Any], Any] | None = None
    """resolve_section(reader, section, hparam_specs, config) -> section, for every config
    (its section is read whether or not it runs): values typed by the algo's hparams."""
    member_overrides: Callable[[StrategySetting], list[dict]] | None = None
    """Per member, the hparams it starts with beyond `config.hparams`; None: the grid's
    combinations or the priors' draws (`independent.member_overrides`)."""
    independent_members: bool = False
    """Its members never exchange anything: members with equal hparams are seeds of one
    configuration (`population.seeds`), and a population of one is allowed."""
    needs_priors: bool = False
    """It draws the hparams that have a prior: `population.priors` must declare one."""
    shared_critic: bool = False
    """Its members are TD3 actors sharing one critic and one replay buffer, updated in one
    program (`algo` with a shared-critic entry, replay.shared, vectorized, no grid)."""
    acts_on_evaluations: bool = True
    """Its steps do something with an evaluation's results (false: independent members): a
    run reports the evaluations that came back too late for a step, and its rounds draw a key
    and wait for the evaluation's program. The one place this is kept: the built `Strategy`
    reads it from `Strategy.entry`."""
    wait_option: str | None = None
    """The config field that makes the learner wait for each evaluation, named where a run
    reports evaluations that came back too late for its steps (pbt's `pbt.wait`)."""
    fresh_trials: bool = False
    """Members restart as fresh trials with emptied buffers (halving): their updates wait for
    replay.min_size rows again."""
    replayable: bool = True
    """A member's line (lineage.jsonl) has an hparam schedule of its own that `fastpop
    pbt-replay` can train afresh; false where members share parameters or restart."""
    mean_member: MeanMember | None = None
    """The member whose evaluations are the population's search mean, not a sample (cemrl's
    0, "CEM mean"): `fastpop eval --member best` picks it and `fastpop plot` draws its return."""
    devices_note: str = ""
    """Appended to the advice when population.size does not split over the devices."""

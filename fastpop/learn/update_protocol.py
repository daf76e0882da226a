"""The learner's one update protocol: how a population's member state is made, updated, read
and changed between evaluation rounds, whatever the strategy.

    init(key, hparams) -> (states, strategy state)      states in the training's own layout
    update(states, buffers, member_hparams, key) -> (states, metrics with leaves (P, K))
    adopt(stacked) -> layout, release(layout) -> stacked    for states and hparams
    policies(states) -> stacked policy params               what collectors act with
    members(states) -> the stacked per-member part          finiteness checks
    between_rounds(Round) -> RoundResult                    the strategy's decision, applied
    move(states, sources) -> states      member i continues from sources[i] (None: a gather)

`executor_training` is the default: members trained independently by a population executor
(vectorized or sequential) and a strategy that decides between rounds with a host-side
`Selection` (independent, PBT, branch-merge), applied here as index gathers on device, followed
by the reset of non-finite members. Strategies whose members share parameters (CEM-RL, DvD)
bring a `Learning` (strategies.base) that `learning_training` adapts. A new way to train (on
device environments) is a new `Training`, never a branch in the learner; members split over
several devices are `make_training(..., mesh=...)` (fastpop.population.sharding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.agents.base import Agent, hparam_fields
from fastpop.learn.replay_store import ReplayStore
from fastpop.population import sharding
from fastpop.strategies.base import (
    Evaluation,
    Selection,
    Strategy,
    reset_events,
    reset_indices,
)
from fastpop.types import PRNGKey, PyTree


class Round(NamedTuple):
    """What a strategy sees and may change after one evaluation round."""

    evaluation: Evaluation  # returns NaN for non-finite members; `finite` filled in
    strategy_state: Any
    states: Any  # the training's layout
    hparams: PyTree  # stacked
    replay: ReplayStore
    key: PRNGKey | None  # None for a strategy that does not act on evaluations


class RoundResult(NamedTuple):
    strategy_state: Any
    states: Any
    hparams: PyTree  # stacked, in force from now on
    events: list[dict]  # lineage records
    scalars: dict  # strategy metrics to log
    changed: np.ndarray | None = None  # (P,) bool: members whose state or hparams changed
    # (None: every member's)
    fresh: np.ndarray | None = None  # (P,) bool: members that started fresh trials


class Training(NamedTuple):
    """One population's training (see the module docstring)."""

    name: str
    init: Callable[[PRNGKey, PyTree], tuple[Any, Any]]
    update: Callable[[Any, Any, Any, PRNGKey], tuple[Any, dict]]
    adopt: Callable[[PyTree], Any]
    release: Callable[[Any], PyTree]
    policies: Callable[[Any], PyTree]
    members: Callable[[Any], PyTree]
    between_rounds: Callable[[Round], RoundResult]
    move: Callable[[Any, np.ndarray], Any] | None = None  # layout-aware member copies


def continue_from(training: Training, states, sources) -> Any:
    """Member i of the result continues from the state of member sources[i]."""
    if training.move is not None:
        return training.move(states, np.asarray(sources))
    return training.adopt(population.gather(training.release(states), jnp.asarray(sources)))


def member_hparams_list(hparams: PyTree) -> list[dict]:
    """Stacked hparams -> one dict of Python numbers per member (as stored: float32, int32);
    optional fields left to the agent's config (None) are not listed."""
    fields = {name: np.asarray(value).tolist() for name, value in hparam_fields(hparams).items()}
    size = len(next(iter(fields.values())))
    return [{name: values[m] for name, values in fields.items()} for m in range(size)]


def selected_hparams(hparams: PyTree, chosen: list[dict]) -> PyTree:
    """Stacked hparams holding the values a strategy chose per member (dtypes kept)."""
    return population.broadcast_hparams(
        population.member(hparams, 0),
        len(chosen),
        **{name: [h[name] for h in chosen] for name in member_hparams_list(hparams)[0]},
    )


def apply_selection(training: Training, states, hparams, selection: Selection, replay, key=None):
    """A strategy's decision on device: member i continues from the state of sources[i] (one
    index gather over the whole member state), with hparams[i], and with a copy of the source's
    replay if the selection says so; members marked fresh start over from a new init (`key`)
    with an empty replay; nothing recompiles. Returns (states, hparams)."""
    if selection.moves_state:
        states = continue_from(training, states, selection.sources)
    if selection.copy_replay:
        replay.copy_members(selection.sources)
    hparams = selected_hparams(hparams, selection.hparams)
    if selection.fresh is not None and selection.fresh.any():
        states = start_over(training, states, hparams, selection.fresh, key)
        replay.clear_members(selection.fresh)
    return states, hparams


def fresh_members(selection: Selection | None, size: int) -> np.ndarray:
    """(P,) bool: the members a selection starts over as fresh trials."""
    if selection is None or selection.fresh is None:
        return np.zeros(size, bool)
    return np.asarray(selection.fresh, bool)


def changed_members(sources, fresh, before: list[dict], after: list[dict]) -> np.ndarray:
    """(P,) bool: members whose state now comes from another member or a fresh init, or whose
    hparams changed (what `Learner.clocks` counts as a new version)."""
    moved = (np.asarray(sources) != np.arange(len(before))) | fresh
    return moved | np.array([a != b for a, b in zip(after, before, strict=True)])


def start_over(training: Training, states, hparams, fresh: np.ndarray, key) -> Any:
    """Members where `fresh` get a new init's state (networks, targets, optimizer moments,
    step counters); the others keep theirs bit for bit."""
    new, _ = training.init(key, hparams)
    mask = jnp.asarray(fresh)
    pick = lambda old, made: jnp.where(mask.reshape(-1, *[1] * (old.ndim - 1)), made, old)
    stacked = jax.tree.map(pick, training.release(states), training.release(new))
    return training.adopt(stacked)


def executor_training(
    agent: Agent, strategy: Strategy, executor: population.Executor, move=None
) -> Training:
    """Independent members under an executor; the strategy decides with `Selection`s.
    `move`: `Training.move` (None: a gather of the whole stacked state)."""
    if executor.name == "sequential":  # stack the policies only, not every member's state
        each = lambda states: [agent.policy_params(state) for state in states]
        policies = jax.jit(lambda states: population.stack(each(states)))  # one program
    else:  # compiled once: the learner publishes after every update (traced, it took 8 ms)
        policies = jax.jit(functools.partial(population.member_policies, agent))

    initialize = population.initializer(agent)  # compiled once: fresh trials reuse it

    def init(key, hparams):
        return executor.adopt(initialize(key, hparams)), strategy.init()

    def between_rounds(round_: Round) -> RoundResult:
        evaluation, states, hparams = round_.evaluation, round_.states, round_.hparams
        before = member_hparams_list(hparams)
        strategy_state, selection = strategy.step(round_.strategy_state, evaluation, before)
        size = len(evaluation.returns)
        sources, events, fresh = np.arange(size), [], fresh_members(selection, size)
        if selection is not None:
            states, hparams = apply_selection(
                training, states, hparams, selection, round_.replay, round_.key
            )
            sources, events = selection.sources, selection.events
        # Members whose state is still not finite continue from the best finite member's,
        # keeping their own hparams (a sweep keeps its configurations).
        returns = evaluation.returns[sources]
        finite = evaluation.finite[sources] | fresh  # a fresh trial's new state is finite
        indices = reset_indices(finite, returns)
        resets = reset_events(strategy.name, evaluation, indices, returns)
        if resets:
            states = continue_from(training, states, indices)
        in_force = member_hparams_list(hparams)
        events = [{**e, "new_hparams": in_force[e["target"]]} for e in events + resets]
        reset = indices != np.arange(size)
        changed = changed_members(sources, fresh, before, in_force) | reset
        return RoundResult(strategy_state, states, hparams, events, {}, changed, fresh)

    training = Training(
        executor.name,
        init,
        executor.update,
        executor.adopt,
        executor.release,
        policies,
        executor.release,
        between_rounds,
        move,
    )
    return training


def learning_training(strategy: Strategy, plan: population.UpdatePlan):
    """A shared-parameter strategy's own `Learning` (CEM-RL, DvD) as a `Training`: its state is
    one tree (shared critic + stacked actors), updated by its own program."""
    learning, agent = strategy.learning, plan.agent
    identity = lambda tree: tree

    def between_rounds(round_: Round) -> RoundResult:
        observations = lambda key: round_.replay.sample(key).obs
        strategy_state, states, scalars, events = learning.step(
            agent, round_.strategy_state, round_.evaluation, round_.states, observations, round_.key
        )
        return RoundResult(strategy_state, states, round_.hparams, events, scalars)

    return Training(
        strategy.name,
        lambda key, hparams: learning.init_states(agent, key, hparams),
        learning.make_update(plan),
        identity,
        identity,
        learning.policies,
        learning.member_trees,
        between_rounds,
    )


def make_training(
    strategy: Strategy, execution: str, plan: population.UpdatePlan, mesh=None
) -> Training:
    """The strategy's own training when it brings one, else `executor_training` of the
    `execution`'s executor; with a `mesh`, members split over its devices
    (fastpop.population.sharding)."""
    if strategy.learning is not None:
        learning = learning_training(strategy, plan)
        return learning if mesh is None else sharding.sharded_learning(learning, mesh)
    if mesh is not None:
        executor = sharding.sharded_executor(plan, mesh)
        return executor_training(plan.agent, strategy, executor, sharding.member_mover(mesh))
    executor = population.make_executor(execution, plan)
    return executor_training(plan.agent, strategy, executor)


def finite_members(training: Training, states) -> np.ndarray:
    """(P,) bool: the member's networks, targets and optimizer state are all finite."""
    return sharding.to_host(population.finite_members(training.members(states)))


def state_template(training: Training, hparams: PyTree) -> PyTree:
    """Shapes and dtypes of the stacked member state, allocating nothing (checkpoint reads)."""
    return jax.eval_shape(
        lambda key: training.release(training.init(key, hparams)[0]), jax.random.key(0)
    )

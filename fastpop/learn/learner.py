"""The learner: all device state of a run (member states, hparams, replay) and the host-side
bookkeeping around it (rate limiter, update counter, the strategy's state).

`Run` (fastpop.run.loop) drives it: `insert` collected rows, `update` when `can_update`,
`policy_copy` / `host_policy_tree` for the workers, `strategy_step` after each evaluation round;
device mode's chunk (fastpop.collect.chunk_programs) runs between `begin_device_chunk` and
`end_device_chunk` on its `state`. Its device arrays are a `LearnerState`, made and updated by
the pure functions of fastpop.learn.learner_state that both modes call; its host counters are
one `Bookkeeping` (fastpop.learn.bookkeeping) that both modes go through.
How members are trained and changed between rounds is the strategy's `Training`
(fastpop.learn.update_protocol); where rows live is the `ReplayStore`: the learner depends on
neither's kind. Its parts are built once, by fastpop.run.parts; its update calls are counted
(and compiled ahead) by `UpdateCalls` (fastpop.learn.update_calls).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.learn import learner_state, member_clocks, policy_copy, update_protocol
from fastpop.learn.bookkeeping import Bookkeeping
from fastpop.learn.learner_state import ChunkPlan, LearnerState
from fastpop.learn.policy_copy import PolicyCopy
from fastpop.learn.rate_limiter import RateLimiter
from fastpop.learn.replay_store import Layout, ReplayStore, rows_adder
from fastpop.learn.update_calls import UpdateCalls
from fastpop.population import replay, sharding
from fastpop.strategies.base import Evaluation, Strategy
from fastpop.strategies.codec import join_strategy_state, split_strategy_state
from fastpop.types import EnvSpec, PyTree


def averaged_metrics(metrics: dict, to_host=np.asarray) -> dict[str, float]:
    """Each metric's mean over members and updates, NaN (no update yet) left out, computed on the
    host: `jnp.nanmean` compiled a program per metric shape on the loop's thread, ~0.3 s each
    before a cold run's first update row."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all NaN: no update yet
        return {f"learner/{k}": float(np.nanmean(to_host(v))) for k, v in metrics.items()}


class LearnerParts(NamedTuple):
    """What a learner is made of, decided once by `fastpop.run.parts.build_run`."""

    agent: Any
    env_spec: EnvSpec
    replay_layout: Layout  # the replay's, made once (replay_store.make_layout)
    sampler: replay.Sampler  # the run's one sampler: its updates' and the replay store's
    population_size: int
    strategy: Strategy
    training: update_protocol.Training
    limiter: RateLimiter
    mesh: Any  # jax.sharding.Mesh, or None: one device
    hparams: PyTree  # every member's initial hparams, stacked
    seed: int
    updates_per_call: int

    @property
    def replay_spec(self) -> replay.ReplaySpec:
        """The replay's rows (what collectors build their chunks with): its sampler's."""
        return self.sampler.spec


class Learner:
    """Device state (member states, replay) and the host-side bookkeeping around it."""

    def __init__(self, parts: LearnerParts):
        self.agent, self.size = parts.agent, parts.population_size
        self.hparams = parts.hparams
        self.mesh = parts.mesh  # None: one device
        self.replay = ReplayStore(parts.sampler, parts.replay_layout, self.size, self.mesh)
        self.strategy = parts.strategy
        self.training = parts.training
        # `learner_state.init_state`'s, the buffers made by the replay store
        made = learner_state.init_agents(self.training, self.hparams, parts.seed)
        self.states, key, self.member_hparams, self.strategy_state = made
        self.key = self._replicated(key)
        self.book = Bookkeeping(
            self.size, parts.limiter, UpdateCalls(self.mesh, parts.updates_per_call)
        )

    # The bookkeeping's counters, as the run loop, progress and checkpoints read them.
    limiter = property(lambda self: self.book.limiter)
    clocks = property(lambda self: self.book.clocks)
    calls = property(lambda self: self.book.calls)

    @property
    def policy_version(self) -> int:
        return self.book.policy_version

    @property
    def buffers(self):
        return self.replay.buffers

    @property
    def state(self) -> LearnerState:
        """Every device array of the learner (its strategy's state aside)."""
        return LearnerState(
            self.replay.buffers, self.states, self.key, self.hparams, self.member_hparams
        )

    @state.setter
    def state(self, state: LearnerState) -> None:
        self.replay.buffers, self.states, self.key = state.buffers, state.states, state.key
        self.hparams, self.member_hparams = state.hparams, state.member_hparams

    def _replicated(self, key):
        """The learner's key on every device of the mesh, as a program over the mesh returns it
        (device mode's chunk program returns it: placed otherwise, it would compile twice)."""
        if self.mesh is None:
            return key
        return sharding.place_from_host(key, sharding.replicated(self.mesh))

    # --- checkpoints ---

    def saved_tree(self, with_replay: bool) -> dict:
        """Every array of the learner's state, for a checkpoint (see fastpop.run.run_state)."""
        strategy_arrays, _ = split_strategy_state(self.strategy_state)
        tree = {
            "states": self.training.release(self.states),  # stacked, whatever the layout
            "hparams": self.hparams,
            "key": self.key,
            "strategy": strategy_arrays,
        }
        if with_replay:
            tree["buffers"] = self.replay.save()
        return tree

    def saved_counters(self) -> dict:
        """The learner's plain-number state: update count, rate limiter, strategy state."""
        return {
            "updates": self.updates,
            "inserted": self.limiter.inserted,
            "sampled": self.limiter.sampled,
            "inserted_at_start": self.limiter.inserted_at_start,
            "refill_from": self.limiter.refill_from,
            "strategy": split_strategy_state(self.strategy_state)[1],
            "replay": self.replay.counters(),
            "clocks": self.clocks.saved(),
        }

    def restore(self, tree: dict, counters: dict) -> None:
        """Continue from a checkpoint's `saved_tree` / `saved_counters`. Without saved buffers
        the replay starts empty and learning waits for replay.min_size new transitions."""
        to_device = lambda tree: jax.tree.map(jnp.asarray, tree)
        self.states = self.training.adopt(to_device(tree["states"]))
        self.hparams = to_device(tree["hparams"])
        self.member_hparams = self.training.adopt(self.hparams)
        self.key = self._replicated(tree["key"])
        self.strategy_state = join_strategy_state(
            self.strategy_state, [jnp.asarray(a) for a in tree["strategy"]], counters["strategy"]
        )
        self.calls.updates = counters["updates"]
        self.clocks.restore(counters["clocks"])
        self.book.policies_changed()
        limiter = self.limiter
        limiter.inserted, limiter.sampled = counters["inserted"], counters["sampled"]
        limiter.inserted_at_start = counters["inserted_at_start"]
        limiter.refill_from = counters["refill_from"]
        self.replay.restore(tree.get("buffers"), counters.get("replay"))
        if "buffers" not in tree:  # refill: the limiter starts over from the empty buffers
            limiter.inserted_at_start, limiter.sampled = None, 0
            limiter.refill_from = limiter.inserted

    # --- the loop's calls ---

    @property
    def updates(self) -> int:
        """Updates per member so far (`UpdateCalls`)."""
        return self.calls.updates

    @property
    def member_env_steps(self) -> int:
        """Env steps inserted per member so far: the run's clock of progress."""
        return self.limiter.inserted

    def policy_tree(self) -> tuple:
        """What collectors and the evaluator act with: stacked policy params and hparams, and
        per member its trial and the env steps of that trial so far (`MemberClocks.published`;
        see `collect.collector.policy_template`)."""
        policy = self.training.policies(self.states)
        return policy, self.hparams, self.clocks.published(self.limiter.inserted)

    def policy_template(self):
        """`policy_tree`'s shapes and dtypes, allocating nothing (what a snapshot decodes to)."""
        return jax.eval_shape(self.policy_tree)

    def policy_copy(self) -> PolicyCopy:
        """The current policies, copied by a program of their own (the next update donates the
        states) and on their way to the host (fastpop.learn.policy_copy)."""
        policy, hparams, clocks = self.policy_tree()
        arrays = (policy_copy.owned(policy, self.states), hparams)
        return PolicyCopy(self.policy_version, arrays, clocks, self.host_array)

    host_array = staticmethod(np.asarray)  # a device array, read (HostLearner: its members)

    def host_policy_tree(self, copy: PolicyCopy | None = None) -> tuple:
        """`policy_tree` as host arrays (the workers'): `copy`'s, or a new one's of the current."""
        copy = self.policy_copy() if copy is None else copy
        return copy.host(self.clocks.published(self.limiter.inserted))

    def policy_leaves(self, copy: PolicyCopy | None = None) -> list[np.ndarray]:
        """`host_policy_tree`'s leaves, in leaf order (shared memory, snapshots)."""
        return jax.tree.leaves(self.host_policy_tree(copy))

    def insert(self, rows, lane_epochs: np.ndarray | None = None) -> None:
        """rows: (population * envs_per_member, chunk_len, ...) numpy arrays, member-major;
        `lane_epochs`: per lane, the trial its collector acted for (None: the current ones).
        A member's rows of a stopped trial are taken out of its buffer again, so that a fresh
        trial learns from its own rows only (`MemberClocks`)."""
        start = self.book.begin_chunk(lane_epochs)
        self.replay.insert(rows)
        self.replay.clear_members(start.stale)

    def begin_device_chunk(self, lanes_per_member: int) -> ChunkPlan:
        """Device mode: the insert of the next chunk of rows (made on the device) recorded, and
        what its programs need fixed: the env steps before it, the join marks (cleared here),
        the update calls the rows allow (`Bookkeeping.calls_due`)."""
        start = self.book.begin_chunk()  # rows made for the current trials: none stale
        joins = self.replay.take_joins()
        calls = np.int32(self.book.calls_due(lanes_per_member))
        return ChunkPlan(start.env_steps, joins, calls, start.restarts)

    def end_device_chunk(self, state: LearnerState, plan: ChunkPlan, metrics: dict) -> None:
        """The state a chunk's programs returned, and their update calls counted (`metrics`:
        the last call's)."""
        self.state = state
        self.book.end_calls(int(plan.calls), metrics)

    def can_update(self) -> bool:
        """The rate limiter allows a call and every buffer holds a transition to sample."""
        return self.limiter.can_sample() and self.replay.ready()

    def compile_update_ahead(self) -> None:
        """The update's programs compiled in a thread (process mode: while the collectors start
        and step their warm-up): `UpdateCalls.compile_ahead`."""
        self.calls.compile_ahead(self.training.update, *self._update_inputs(), self.key)

    def update_phase(self, first: bool) -> str:
        """What the progress line calls the next update (`first`: the run's first):
        `UpdateCalls.phase`."""
        return self.calls.phase(first, self.training.update, *self._update_inputs(), self.key)

    def update(self) -> None:
        """Dispatches an update call (it runs while the host goes on; the states are donated)."""
        self.calls.wait_for_ahead()
        self.state, metrics = learner_state.update_call(self.training, self.state)
        self.book.end_calls(1, metrics)

    def wait_for_update(self) -> None:
        """Until the last update's states are computed."""
        jax.block_until_ready(self.states)

    def _update_inputs(self) -> tuple:
        """What `training.update` is called with, its key aside."""
        return self.states, self.replay.buffers, self.member_hparams

    @property
    def last_metrics(self) -> dict[str, float]:
        """The latest update call's metrics, averaged over members and updates."""
        return averaged_metrics(self.calls.metrics or {})

    def all_member_hparams(self) -> list[dict]:
        return update_protocol.member_hparams_list(self.hparams)

    def member_labels(self) -> list[dict] | None:
        """Per member, what its rows carry beside its hparams (halving: its trial id)."""
        labels = self.strategy.member_labels
        return None if labels is None else labels(self.strategy_state)

    def finite_members(self) -> np.ndarray:
        """(P,) bool: the member's networks, targets and optimizer state are all finite."""
        return update_protocol.finite_members(self.training, self.states)

    def apply_selection(self, selection) -> None:
        """Apply a `strategies.base.Selection` now (what `strategy_step` does with a strategy's)."""
        self.key, key = jax.random.split(self.key)
        before = self.all_member_hparams()
        self.states, self.hparams = update_protocol.apply_selection(
            self.training, self.states, self.hparams, selection, self.replay, key
        )
        self.member_hparams = self.training.adopt(self.hparams)
        fresh = update_protocol.fresh_members(selection, self.size)
        after = self.all_member_hparams()
        changed = update_protocol.changed_members(selection.sources, fresh, before, after)
        self.book.policies_changed(changed)
        self.clocks.start_trials(fresh)

    def snapshot_facts(self) -> dict:
        """What each member is as a snapshot of its policy is taken, kept with the pending
        snapshot (`member_clocks.snapshot_facts`)."""
        return member_clocks.snapshot_facts(self.clocks, self.limiter.inserted, self.updates)

    def strategy_step(self, evaluation: Evaluation) -> tuple[list[dict], dict]:
        """Hand an evaluation round to the strategy's training: it applies the strategy's
        decision on device and resets members whose state is not finite. Fields of the
        round left None are the members' as they are now (`member_clocks.completed`).
        Returns the lineage events (with the hparams in force after them) and scalars to log."""
        finite = self.finite_members() if evaluation.finite is None else evaluation.finite
        now = member_clocks.snapshot_facts(self.clocks, self.limiter.inserted, self.updates)
        evaluation = member_clocks.completed(evaluation, finite, self.all_member_hparams(), now)
        returns = np.where(finite, evaluation.returns, np.nan)  # ranks last; PBT replaces it
        evaluation = evaluation._replace(returns=returns)
        key = None  # independent members' rounds draw nothing: when their results come back
        if self.strategy.acts_on_evaluations:  # then changes no update's key
            self.key, key = jax.random.split(self.key)
        result = self.training.between_rounds(
            update_protocol.Round(
                evaluation, self.strategy_state, self.states, self.hparams, self.replay, key
            )
        )
        self.strategy_state, self.states, self.hparams = result[:3]
        self.member_hparams = self.training.adopt(self.hparams)
        changed = np.ones(self.size, bool) if result.changed is None else result.changed
        self.book.policies_changed(changed)
        if result.fresh is not None:
            self.clocks.start_trials(result.fresh)
        return result.events, result.scalars


def chunk_program_inputs(parts: LearnerParts) -> tuple:
    """(add_rows, the `LearnerState`'s shapes) of the learner `parts` make, without making it:
    its replay's rows as a pure function (`replay_store.rows_adder`: device mode's insert) and
    `jax.eval_shape` of `learner_state.init_state`. What device mode traces its chunk programs
    from while the learner is made; nothing allocated or compiled. One device."""
    layout = parts.replay_layout
    init = lambda: learner_state.init_state(parts.training, layout.empty, parts.hparams, parts.seed)
    return rows_adder(layout, parts.population_size), jax.eval_shape(lambda: init()[0])

"""A run's evaluation rounds: every eval.interval env steps per member a snapshot of the
policies goes to the evaluator; each result comes back as metrics.jsonl rows and, during
training, as a step of the strategy.

The snapshots not answered yet are kept (`PendingEvaluations`, saved in checkpoints): a
restarted evaluator, and a resumed run's, is handed them again.

`LoopServices` is what the loop hands its evaluation rounds and its checkpoints
(fastpop.run.run_checkpoints): the run's collaborators they work with (learner, collection,
clocks, writers), never the run itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.collect.sources import Collection
from fastpop.learn.learner import Learner
from fastpop.run import progress as progress_lib
from fastpop.run.metrics import MetricsWriter
from fastpop.run.phases import PhaseClock, PhaseWatch
from fastpop.run.progress import PendingEvaluations, RunProgress, evaluation_rows
from fastpop.run.stop_signals import StopSignals
from fastpop.run.update_pipeline import UpdatePipeline
from fastpop.strategies.base import Strategy


class LoopServices(NamedTuple):
    """The collaborators of a run (`fastpop.run.loop.Run`) its evaluation rounds and checkpoints
    work with; what changes as the run goes on is read from them (`learner.member_env_steps`) or
    called for (`elapsed`, `metrics`)."""

    config: config_lib.Config
    learner: Learner
    collection: Collection
    updates: UpdatePipeline  # the update in flight: waited for, finished
    progress: RunProgress  # one object for the whole run (a resume restores it in place)
    clock: PhaseClock
    watch: PhaseWatch
    signals: StopSignals
    elapsed: Callable[[], float]  # the run's clock (a distributed run's: the agreed one)
    metrics: Callable[[], MetricsWriter]  # the run's writer, opened as the run starts
    log: Callable[[str], None]


class EvaluationRounds:
    """The evaluation rounds of a run (`services`): its snapshots, kept in `pending` until
    answered, their results, the strategy's steps on them."""

    def __init__(self, services: LoopServices, strategy: Strategy, pending: PendingEvaluations):
        self.services, self.strategy, self.pending = services, strategy, pending
        self.training_done = False  # no strategy steps on the final evaluation
        self.evaluator_restarts_seen = 0

    def waiting(self) -> bool:
        """Whether the strategy waits for an evaluation not in yet before the members train on."""
        return self.strategy.waits_for_evaluation and bool(self.pending)

    def snapshot_if_due(self) -> None:
        progress = self.services.progress
        if self.services.learner.member_env_steps >= progress.next_eval:
            self.snapshot()
            progress.next_eval += self.strategy.evaluation_interval

    def snapshot(self) -> None:
        services = self.services
        services.updates.finish()  # the snapshot is of the policies the update makes
        progress, learner = services.progress, services.learner
        seconds = progress.timers["evaluation_snapshots"]
        progress.evaluation_seconds_at[progress.eval_index] = seconds
        with services.clock("evaluation_snapshots"):
            meta = snapshot.SnapshotMeta(
                progress.eval_index,
                learner.member_env_steps * services.config.population.size,
                learner.updates,
                services.elapsed(),
            )
            with services.watch.phase("evaluation snapshot"):
                arrays = snapshot.encode(learner.policy_leaves(services.updates.current()), meta)
                services.collection.evaluate(arrays)
            hparams, labels = learner.all_member_hparams(), learner.member_labels()
            self.pending.add(arrays, hparams, labels, learner.snapshot_facts())
            progress.snapshot_env_steps = learner.member_env_steps
            progress.eval_index += 1

    def resend(self) -> None:
        """Every unanswered snapshot handed to the evaluator again, oldest first."""
        for arrays in self.pending.in_order():
            self.services.collection.evaluate(arrays)

    def _resend_lost_snapshots(self) -> None:
        """After an evaluator restart, hand every unanswered snapshot to the new one (those still
        in the ring are evaluated twice; the second result is ignored)."""
        collection = self.services.collection
        if collection.evaluator_restarts == self.evaluator_restarts_seen:
            return
        self.evaluator_restarts_seen = collection.evaluator_restarts
        self.resend()

    def receive(self, timeout: float = 0.0) -> None:
        """Results in (waiting up to `timeout` for one), and a strategy step on each during
        training, its update in flight done and the policies it makes sent."""
        services = self.services
        phase = "final_evaluation" if self.training_done else "evaluation_results"
        with services.clock(phase):
            self._resend_lost_snapshots()
            results = services.collection.evaluations(timeout)
        for result in results:
            with services.clock(phase):
                taken = self.pending.take(result["eval_index"])
                if taken is None:
                    continue  # a duplicate after an evaluator restart
                services.progress.latest_returns = np.array(result["return_mean"])
                hparams, labels, facts = taken
                seconds = services.progress.evaluation_seconds_before(result["eval_index"])
                episodes = services.config.eval.episodes
                rows = evaluation_rows(result, hparams, episodes, labels, seconds)
                services.metrics().log_evaluation(rows)
            if not self.training_done:
                services.updates.wait()
                step = f"{self.strategy.name} strategy step"
                with services.clock("strategies"), services.watch.phase(step):
                    self._strategy_step(result, hparams, facts)
                services.updates.finish()

    def _strategy_step(self, result: dict, hparams: list[dict], facts: dict | None) -> None:
        """Hand the round to the strategy with the members as they were at its snapshot (the
        result may come back after they trained on: `Evaluation`); apply its selection on
        device and log its lineage."""
        learner, metrics = self.services.learner, self.services.metrics()
        returns = np.array(result["return_mean"], np.float64)
        finite = learner.finite_members()
        for member in np.flatnonzero(~finite):
            metrics.log_event("non_finite_member", {"member": int(member)})
        evaluation = progress_lib.round_evaluation(result, returns, finite, hparams, facts)
        events, scalars = learner.strategy_step(evaluation)
        now, env_steps = self.services.elapsed(), learner.member_env_steps * len(returns)
        metrics.log_lineage([{"wall_time": now, "env_steps": env_steps, **e} for e in events])
        if scalars:
            metrics.log_scalars(result["env_steps"], scalars)

    def final(self) -> None:
        """Evaluate the final policies (unless the last interval snapshot was taken at the final
        env step count) and wait for all."""
        services = self.services
        self.training_done = True
        if services.progress.snapshot_env_steps < services.learner.member_env_steps:
            self.snapshot()
        final = services.progress.eval_index - 1  # the last snapshot: of the final policies
        late = sum(index != final for index in self.pending.snapshots)
        deadline = time.monotonic() + 600
        with (
            services.watch.phase("waiting for the final evaluation"),
            services.clock("final_evaluation"),
        ):
            while self.pending and time.monotonic() < deadline:
                services.signals.check()
                self.receive(timeout=0.1)
        if (line := progress_lib.late_evaluations_line(late, self.strategy.name)) is not None:
            services.log(line)

"""A run's evaluation rounds: every eval.interval env steps per member a snapshot of the
policies goes to the evaluator; each result comes back as metrics.jsonl rows and, during
training, as a step of the strategy.

The snapshots not answered yet are kept (`PendingEvaluations`, saved in checkpoints): a
restarted evaluator, and a resumed run's, is handed them again.
"""

from __future__ import annotations

import time

import numpy as np

from fastpop.collect import snapshot
from fastpop.run import progress as progress_lib
from fastpop.run.progress import PendingEvaluations, evaluation_rows


class EvaluationRounds:
    """The evaluation rounds of `run` (a `fastpop.run.loop.Run`): its snapshots, their
    results, the strategy's steps on them."""

    def __init__(self, run):
        self.run = run
        self.strategy = run.parts.learner.strategy
        self.pending = PendingEvaluations()
        self.training_done = False  # no strategy steps on the final evaluation
        self.evaluator_restarts_seen = 0

    def waiting(self) -> bool:
        """Whether the strategy waits for an evaluation not in yet before the members train on."""
        return self.strategy.waits_for_evaluation and bool(self.pending)

    def snapshot_if_due(self) -> None:
        progress = self.run.progress
        if self.run.member_env_steps >= progress.next_eval:
            self.snapshot()
            progress.next_eval += self.strategy.evaluation_interval

    def snapshot(self) -> None:
        run = self.run
        run.updates.finish()  # the snapshot is of the policies the update makes
        progress, learner = run.progress, run.learner
        progress.evaluation_seconds_at[progress.eval_index] = run.timers["evaluation_snapshots"]
        with run.clock("evaluation_snapshots"):
            meta = snapshot.SnapshotMeta(
                progress.eval_index,
                run.member_env_steps * run.config.population.size,
                learner.updates,
                run.elapsed(),
            )
            with run.watch.phase("evaluation snapshot"):
                arrays = snapshot.encode(learner.policy_leaves(run.updates.current()), meta)
                run.collection.evaluate(arrays)
            hparams, labels = learner.all_member_hparams(), learner.member_labels()
            self.pending.add(arrays, hparams, labels, learner.snapshot_facts())
            progress.snapshot_env_steps = run.member_env_steps
            progress.eval_index += 1

    def resend(self) -> None:
        """Every unanswered snapshot handed to the evaluator again, oldest first."""
        for arrays in self.pending.in_order():
            self.run.collection.evaluate(arrays)

    def _resend_lost_snapshots(self) -> None:
        """After an evaluator restart, hand every unanswered snapshot to the new one (those still
        in the ring are evaluated twice; the second result is ignored)."""
        collection = self.run.collection
        if collection.evaluator_restarts == self.evaluator_restarts_seen:
            return
        self.evaluator_restarts_seen = collection.evaluator_restarts
        self.resend()

    def receive(self, timeout: float = 0.0) -> None:
        """Results in (waiting up to `timeout` for one), and a strategy step on each during
        training, its update in flight done and the policies it makes sent."""
        run = self.run
        phase = "final_evaluation" if self.training_done else "evaluation_results"
        with run.clock(phase):
            self._resend_lost_snapshots()
            results = run.collection.evaluations(timeout)
        for result in results:
            with run.clock(phase):
                taken = self.pending.take(result["eval_index"])
                if taken is None:
                    continue  # a duplicate after an evaluator restart
                run.progress.latest_returns = np.array(result["return_mean"])
                hparams, labels, facts = taken
                seconds = run.progress.evaluation_seconds_before(result["eval_index"])
                rows = evaluation_rows(result, hparams, run.config.eval.episodes, labels, seconds)
                run.metrics.log_evaluation(rows)
            if not self.training_done:
                run.updates.wait()
                step = f"{self.strategy.name} strategy step"
                with run.clock("strategies"), run.watch.phase(step):
                    self._strategy_step(result, hparams, facts)
                run.updates.finish()

    def _strategy_step(self, result: dict, hparams: list[dict], facts: dict | None) -> None:
        """Hand the round to the strategy with the members as they were at its snapshot (the
        result may come back after they trained on: `Evaluation`); apply its selection on
        device and log its lineage."""
        run, learner = self.run, self.run.learner
        returns = np.array(result["return_mean"], np.float64)
        finite = learner.finite_members()
        for member in np.flatnonzero(~finite):
            run.metrics.log_event("non_finite_member", {"member": int(member)})
        evaluation = progress_lib.round_evaluation(result, returns, finite, hparams, facts)
        events, scalars = learner.strategy_step(evaluation)
        now, env_steps = run.elapsed(), run.member_env_steps * len(returns)
        run.metrics.log_lineage([{"wall_time": now, "env_steps": env_steps, **e} for e in events])
        if scalars:
            run.metrics.log_scalars(result["env_steps"], scalars)

    def final(self) -> None:
        """Evaluate the final policies (unless the last interval snapshot was taken at the final
        env step count) and wait for all."""
        run = self.run
        self.training_done = True
        if run.progress.snapshot_env_steps < run.member_env_steps:
            self.snapshot()
        final = run.progress.eval_index - 1  # the last snapshot: of the final policies
        late = sum(index != final for index in self.pending.snapshots)
        deadline = time.monotonic() + 600
        with run.watch.phase("waiting for the final evaluation"), run.clock("final_evaluation"):
            while self.pending and time.monotonic() < deadline:
                run.signals.check()
                self.receive(timeout=0.1)
        if (line := progress_lib.late_evaluations_line(late, self.strategy.name)) is not None:
            run.log(line)

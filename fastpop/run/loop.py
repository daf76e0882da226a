"""The training loop: collectors feed the device replay, the learner updates the population.

    drain chunks -> replay.add -> rate limiter -> K-step population update -> collectors' params
    (an update runs on the device while the host publishes the policies of the one before it
    and drains the next chunks: run/update_pipeline.py)
    every eval.interval env steps: snapshot -> evaluator process -> metrics.jsonl
    every checkpoint interval and at every stop: the whole run -> checkpoints/ (run/run_state.py)

Nothing here is algorithm-specific. The learner owns all device state; collector and evaluator
processes (fastpop.collect) step CPU simulators and talk to it through shared memory.
"""

from __future__ import annotations

import contextlib
import errno
import math
import time
from pathlib import Path

import numpy as np

from fastpop import config as config_lib
from fastpop import strategies
from fastpop.collect import snapshot
from fastpop.collect.workers import WorkerFailed
from fastpop.run import checkpoint, run_state
from fastpop.run import progress as progress_lib
from fastpop.run.metrics import MetricsWriter, rewind_logs, write_members
from fastpop.run.parts import RunParts, RunPieces, local_pieces
from fastpop.run.phases import PhaseClock, PhaseWatch
from fastpop.run.progress import PendingEvaluations, RunProgress, evaluation_rows
from fastpop.run.stop_signals import StopRequested
from fastpop.run.trackers import check_trackers, open_trackers
from fastpop.run.update_pipeline import UpdatePipeline

CHECKPOINTS_DIR = "checkpoints"
CONFIG_FILE = "config.yaml"  # the resolved config the run (or its latest resume) started with
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
__all__ = ["Run", "StopRequested", "TrainError"]


class TrainError(RuntimeError):
    """The run could not go on (a worker failed beyond its restarts); the message says why."""


class Run:
    """One training run: the loop, its clock, its outputs."""

    def __init__(self, parts: RunParts, run_dir: Path, log=print, pieces: RunPieces | None = None):
        check_trackers(parts.config.log)  # a missing wandb: refused before anything starts
        self.parts = parts
        self.config = config = parts.config  # the record written with the run
        self.run_dir = run_dir
        self.log = log
        self.spec = parts.env_spec
        if pieces is None:
            pieces = local_pieces(parts, run_dir / CHECKPOINTS_DIR, log)
        self.learner, self.collection, self.signals, self.checkpoints = pieces
        self.strategy = parts.strategy
        interval = self.strategy.evaluation_interval
        self.progress = RunProgress(config.population.size, next_eval=interval)
        self.pending = PendingEvaluations()
        self.training_done = False  # no strategy steps on the final evaluation
        self.checkpoint_dir = run_dir / CHECKPOINTS_DIR
        self.resumed_from: dict | None = None  # what a resume restored (see `restore`)
        self.evaluator_restarts_seen = 0
        self.last_progress = time.monotonic()
        # Says what a call longer than a progress interval is doing (the first update compiles),
        # and times every phase of the run for its time breakdown.
        self.watch = PhaseWatch(log, config.log.progress_interval_seconds)
        self.clock = PhaseClock(lambda: self.progress.timers)
        self.updates = UpdatePipeline(
            self.learner, self.collection, self.clock, self.watch, self.signals.check
        )

    @property
    def member_env_steps(self) -> int:
        return self.learner.member_env_steps

    @property
    def timers(self) -> dict:
        return self.progress.timers

    def elapsed(self) -> float:
        return self.progress.elapsed()

    def run(self) -> dict:
        stopped_by = "completed"
        with contextlib.ExitStack() as running:
            with self.clock("starting"):
                self._start(running)
            try:
                self.signals.in_loop = True
                self._loop()
                self._final_evaluation()
            except (KeyboardInterrupt, StopRequested) as stop:
                stopped_by = "terminated" if isinstance(stop, StopRequested) else "interrupted"
                self.log(f"stopping: {stopped_by}")
            except WorkerFailed:
                self._stop_checkpoint("worker failed")
                raise
            except OSError as error:
                raise self._write_failed(error) from None
            self._stop_checkpoint(stopped_by)
            with self.clock("stopping"):
                self.worker_stats = self.collection.stop()
            return self._summary(stopped_by)

    def _start(self, running: contextlib.ExitStack) -> None:
        """Everything before the loop: the config and members written, and the contexts the
        loop runs in entered into `running` (signals, phase watch, metrics, the collection)."""
        config = self.config
        config_lib.save_config(config, self.run_dir / CONFIG_FILE)
        purge_step = None
        if self.resumed_from is None:
            hparams = self.learner.all_member_hparams()
            # each member's config_index and seed_index
            indices = strategies.member_configurations(config.population)
            labels = self.learner.member_labels() or [{}] * len(hparams)
            write_members(self.run_dir, config.strategy, hparams, indices, labels)
        else:  # rows logged after the checkpoint are written again by this run
            rewind_logs(self.run_dir, self.resumed_from["logs"])
            purge_step = self.member_env_steps * config.population.size
        running.enter_context(self.signals)
        running.enter_context(self.watch)
        self.metrics = metrics = running.enter_context(self.open_metrics(purge_step))
        generation = self.progress.resumes
        running.enter_context(self.collection.running(self.learner, metrics.log_event, generation))
        if hasattr(self.collection, "stop_check"):  # before its workers are checked
            self.collection.stop_check = self.signals.check
        self._announce_resume()

    def open_metrics(self, purge_step: int | None) -> MetricsWriter:
        trackers = open_trackers(self.config, self.run_dir)
        return MetricsWriter(self.run_dir, self.config.log.tensorboard, False, purge_step, trackers)

    # --- checkpoints ---

    def save_checkpoint(self, reason: str) -> Path:
        """The whole run as it is now, its updates done: see fastpop.run.run_state for what
        goes where."""
        self.updates.wait(check=False)
        start = time.perf_counter()
        with_replay = self.config.checkpoint.replay
        with self.clock("checkpoints"), self.watch.phase(f"writing a checkpoint ({reason})"):
            self.clock.lap()  # the timers it saves: every second until now
            tree, metadata = run_state.capture(self, reason)
            path = self.checkpoints.save(self.member_env_steps, tree, metadata)
        seconds = time.perf_counter() - start
        self.progress.last_checkpoint = (self.elapsed(), self.member_env_steps)
        fields, written = self.checkpoints.describe(path)
        self.metrics.log_event(
            "checkpoint",
            {"path": str(path), "reason": reason, "member_env_steps": self.member_env_steps}
            | {"seconds": seconds, **fields, "replay": with_replay},
        )
        self.log(f"checkpoint {path} ({reason}; {written} in {seconds:.1f}s)")
        return path

    def _stop_checkpoint(self, reason: str) -> None:
        if self.signals.stopped_at_once:
            self.log(f"stopped at once: no checkpoint written ({self._newest_checkpoint()})")
            return
        try:
            self.save_checkpoint(reason)
        except OSError as error:
            raise self._write_failed(error) from None
        except (KeyboardInterrupt, StopRequested):  # a repeated signal: stop at once
            self.log(f"stopped at once: checkpoint abandoned ({self._newest_checkpoint()})")
            return
        if reason != "completed":
            self.log(f"continue it with: fastpop resume {self.run_dir}")

    def _newest_checkpoint(self) -> str:
        newest = checkpoint.complete_checkpoints(self.checkpoint_dir)
        return f"newest complete checkpoint: {newest[0]}" if newest else "no checkpoint yet"

    def _write_failed(self, error: OSError) -> TrainError:
        what = "the disk is full" if error.errno in DISK_FULL else "a write failed"
        return TrainError(
            f"stopping: {what} ({error}); {self._newest_checkpoint()} (intact; resume from "
            f"it with `fastpop resume {self.run_dir}` once there is room)"
        )

    def checkpoint_template(self, metadata: dict) -> dict:
        return run_state.template(self, metadata)

    def restore(self, tree: dict, metadata: dict, path: Path) -> None:
        """Continue from a checkpoint (before `run`): the learner and the collection restore
        their own state; the run adopts the progress and pending evaluations restored for it."""
        restored = run_state.restore(self, tree, metadata)
        self.progress, self.pending = restored.progress, restored.pending
        self.resumed_from = {"path": str(path), "logs": metadata["logs"], **metadata["run"]}

    def restore_latest(self, warn=print) -> Path:
        """Continue from the newest checkpoint that reads back whole; returns its path."""
        tree, metadata, path = self.checkpoints.restore_latest(self.checkpoint_template, warn)
        self.restore(tree, metadata, path)
        return path

    def _announce_resume(self) -> None:
        resumed = self.resumed_from
        if resumed is None:
            return
        replay = (
            "replay restored"
            if resumed["replay_saved"]
            else "replay not saved (checkpoint.replay: false): the buffers refill from the "
            f"collectors, learning waits for replay.min_size={self.config.replay.min_size}"
        )
        self.log(
            f"resumed from {resumed['path']}: {self.member_env_steps:,} env steps per member, "
            f"{self.learner.updates:,} updates, {resumed['elapsed']:.0f}s of wall time; {replay}"
        )
        self.metrics.log_event(
            "resumed",
            {"path": resumed["path"], "member_env_steps": self.member_env_steps}
            | {"wall_time": resumed["elapsed"], "replay_restored": resumed["replay_saved"]},
        )
        for arrays in self.pending.in_order():  # results the previous process never received
            self.collection.evaluate(arrays)

    def _loop(self) -> None:
        total = self.config.train.total_env_steps
        max_seconds = self.config.train.max_wall_seconds or math.inf
        while self.member_env_steps < total and self.elapsed() < max_seconds:
            self.signals.check()
            busy = self._collect()  # rows move while the update in flight computes
            # What must see finished updates (a strategy step, the progress line, a checkpoint)
            # waits for the one in flight first.
            waiting = self.strategy.waits_for_evaluation and bool(self.pending)
            self._receive_evaluations(timeout=0.01 if waiting else 0.0)
            self._progress()
            every, steps = self.config.checkpoint, self.member_env_steps
            if self.progress.checkpoint_due(every, self.elapsed(), steps):
                self.save_checkpoint("interval")
            waiting = self.strategy.waits_for_evaluation and bool(self.pending)
            if not waiting and self.updates.can_start():
                if self.progress.learning_started_at is None:
                    self.progress.learning_started_at = self.elapsed()
                self.updates.start()  # then publishes the policies of the update before it
                busy = True
            elif self.updates.publish_if_done():
                busy = True
            if not busy:
                with self.clock("idle"):
                    time.sleep(0.001)
        self.updates.finish()

    def _collect(self) -> bool:
        """Moves complete chunks (one per collector) into the replay while the limiter allows;
        device mode: one chunk per pass, inserted and learned from in one compiled call."""
        moved, limit = 0, self.collection.chunks_per_pass
        while (
            self.learner.limiter.can_insert()
            and self.member_env_steps < self.config.train.total_env_steps
            and (limit is None or moved < limit)
        ):
            with self.clock("transport"):
                episodes = self.collection.feed(self.learner)
            if episodes is None:
                break
            self._note_learning_started()
            for episode in episodes:
                self.progress.training_returns[episode.member].append(episode.episode_return)
            moved += 1
            if self.member_env_steps >= self.progress.next_eval:
                self._snapshot_for_evaluation()
                self.progress.next_eval += self.strategy.evaluation_interval
        return moved > 0

    def _note_learning_started(self) -> None:
        if self.progress.learning_started_at is None and self.learner.updates:
            self.progress.learning_started_at = self.elapsed()

    def _snapshot_for_evaluation(self) -> None:
        self.updates.finish()  # the snapshot is of the policies the update makes
        progress, learner = self.progress, self.learner
        progress.evaluation_seconds_at[progress.eval_index] = self.timers["evaluation_snapshots"]
        with self.clock("evaluation_snapshots"):
            meta = snapshot.SnapshotMeta(
                progress.eval_index,
                self.member_env_steps * self.config.population.size,
                learner.updates,
                self.elapsed(),
            )
            with self.watch.phase("evaluation snapshot"):
                arrays = snapshot.encode(learner.policy_leaves(self.updates.current()), meta)
                self.collection.evaluate(arrays)
            hparams, labels = learner.all_member_hparams(), learner.member_labels()
            self.pending.add(arrays, hparams, labels, learner.snapshot_facts())
            progress.snapshot_env_steps = self.member_env_steps
            progress.eval_index += 1

    def _resend_lost_snapshots(self) -> None:
        """After an evaluator restart, hand every unanswered snapshot to the new one (those still
        in the ring are evaluated twice; the second result is ignored)."""
        if self.collection.evaluator_restarts == self.evaluator_restarts_seen:
            return
        self.evaluator_restarts_seen = self.collection.evaluator_restarts
        for arrays in self.pending.in_order():
            self.collection.evaluate(arrays)

    def _receive_evaluations(self, timeout: float = 0.0) -> None:
        """Results in (waiting up to `timeout` for one), and a strategy step on each during
        training, its update in flight done and the policies it makes sent."""
        phase = "final_evaluation" if self.training_done else "evaluation_results"
        with self.clock(phase):
            self._resend_lost_snapshots()
            results = self.collection.evaluations(timeout)
        for result in results:
            with self.clock(phase):
                taken = self.pending.take(result["eval_index"])
                if taken is None:
                    continue  # a duplicate after an evaluator restart
                self.progress.latest_returns = np.array(result["return_mean"])
                hparams, labels, facts = taken
                seconds = self.progress.evaluation_seconds_before(result["eval_index"])
                rows = evaluation_rows(result, hparams, self.config.eval.episodes, labels, seconds)
                self.metrics.log_evaluation(rows)
            if not self.training_done:
                self.updates.wait()
                step = f"{self.strategy.name} strategy step"
                with self.clock("strategies"), self.watch.phase(step):
                    self._strategy_step(result, hparams, facts)
                self.updates.finish()

    def _strategy_step(self, result: dict, hparams: list[dict], facts: dict | None) -> None:
        """Hand the round to the strategy with the members as they were at its snapshot (the
        result may come back after they trained on: `Evaluation`); apply its selection on
        device and log its lineage."""
        learner = self.learner
        returns = np.array(result["return_mean"], np.float64)
        finite = learner.finite_members()
        for member in np.flatnonzero(~finite):
            self.metrics.log_event("non_finite_member", {"member": int(member)})
        evaluation = progress_lib.round_evaluation(result, returns, finite, hparams, facts)
        events, scalars = learner.strategy_step(evaluation)
        now, env_steps = self.elapsed(), self.member_env_steps * len(returns)
        self.metrics.log_lineage([{"wall_time": now, "env_steps": env_steps, **e} for e in events])
        if scalars:
            self.metrics.log_scalars(result["env_steps"], scalars)

    def _final_evaluation(self) -> None:
        """Evaluate the final policies (unless the last interval snapshot was taken at the final
        env step count) and wait for all."""
        self.training_done = True
        if self.progress.snapshot_env_steps < self.member_env_steps:
            self._snapshot_for_evaluation()
        final = self.progress.eval_index - 1  # the last snapshot: of the final policies
        late = sum(index != final for index in self.pending.snapshots)
        deadline = time.monotonic() + 600
        with self.watch.phase("waiting for the final evaluation"):
            while self.pending and time.monotonic() < deadline:
                self.signals.check()
                self._receive_evaluations(timeout=0.1)
        if (line := progress_lib.late_evaluations_line(late, self.strategy.name)) is not None:
            self.log(line)

    def _progress(self) -> None:
        """The progress line and the learner's metrics, every progress interval (of the update
        in flight, waited for)."""
        now = time.monotonic()
        if now - self.last_progress < self.config.log.progress_interval_seconds:
            return
        self.last_progress = now
        self.updates.wait()
        with self.clock("progress"):
            self._log_progress()

    def _log_progress(self) -> None:
        learner, size = self.learner, self.config.population.size
        elapsed = self.elapsed()
        env_steps = self.member_env_steps * size
        fraction = self.member_env_steps / self.config.train.total_env_steps
        seconds_left = elapsed * (1 - fraction) / fraction if fraction > 0 else math.inf
        if self.config.train.max_wall_seconds is not None:
            seconds_left = min(seconds_left, self.config.train.max_wall_seconds - elapsed)
        left = f"~{seconds_left:.0f}s left" if math.isfinite(seconds_left) else "starting"
        waiting_on = getattr(self.collection, "waiting_on", None)  # process mode's workers
        if env_steps == 0 and waiting_on is not None and (waiting := waiting_on()):
            left = f"starting: {waiting}"
        returns, updates = self.progress.returns_so_far(), learner.updates
        self.log(progress_lib.progress_line(elapsed, env_steps, updates, size, returns, left))
        if learner.last_metrics:
            self.metrics.log_scalars(env_steps, learner.last_metrics)

    def _summary(self, stopped_by: str) -> dict:
        summary = progress_lib.run_summary(stopped_by, self.elapsed(), self.learner, self.progress)
        summary |= {
            "collect_mode": self.parts.collection_mode,
            # this process's seconds per phase, and those no phase covered
            "learner_seconds": progress_lib.time_breakdown(self.timers, self.progress.elapsed()),
            "workers": self.worker_stats,
        }
        self.log(progress_lib.format_breakdown(summary))
        return summary

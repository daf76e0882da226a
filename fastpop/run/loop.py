"""The training loop: collectors feed the device replay, the learner updates the population.

    drain chunks -> replay.add -> rate limiter -> K-step population update -> collectors' params
    (an update runs on the device while the host publishes the policies of the one before it
    and drains the next chunks: run/update_pipeline.py)
    every eval.interval env steps: snapshot -> evaluator process -> metrics.jsonl
    every checkpoint interval and at every stop: the whole run -> checkpoints/ (run/run_state.py)

Nothing here is algorithm-specific. The learner owns all device state; collector and evaluator
processes (fastpop.collect) step CPU simulators and talk to it through shared memory. The
loop's evaluation rounds are in fastpop.run.evaluation_rounds, its checkpoints in
fastpop.run.run_checkpoints.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

from fastpop import config as config_lib
from fastpop import strategies
from fastpop.collect.workers import WorkerFailed
from fastpop.run import progress as progress_lib
from fastpop.run.evaluation_rounds import EvaluationRounds, LoopServices
from fastpop.run.metrics import MetricsWriter, rewind_logs, write_members
from fastpop.run.parts import RunParts
from fastpop.run.phases import PhaseClock, PhaseWatch
from fastpop.run.progress import PendingEvaluations, RunProgress
from fastpop.run.run_checkpoints import RunCheckpoints, TrainError
from fastpop.run.startup import RunPieces, local_pieces
from fastpop.run.stop_signals import StopRequested
from fastpop.run.trackers import open_trackers
from fastpop.run.update_pipeline import UpdatePipeline

CHECKPOINTS_DIR = "checkpoints"
CONFIG_FILE = "config.yaml"  # the resolved config the run (or its latest resume) started with
__all__ = ["Run", "StopRequested", "TrainError"]


class Run:
    """One training run: the loop, its clock, its outputs; its evaluation rounds
    (`evaluations`) and checkpoints (`checkpoints`) kept apart."""

    def __init__(self, parts: RunParts, run_dir: Path, log=print, pieces: RunPieces | None = None):
        self.parts = parts
        self.config = config = parts.config  # the record written with the run
        self.run_dir = run_dir
        self.log = log
        if pieces is None:
            pieces = local_pieces(parts, run_dir / CHECKPOINTS_DIR, log)
        self.learner, self.collection, self.signals, store = pieces
        strategy = parts.learner.strategy
        self.progress = RunProgress(config.population.size, next_eval=strategy.evaluation_interval)
        self.last_progress = time.monotonic()
        # Says what a call longer than a progress interval is doing (the first update compiles),
        # and times every phase of the run for its time breakdown.
        self.watch = PhaseWatch(log, config.log.progress_interval_seconds)
        self.clock = PhaseClock(lambda: self.progress.timers)
        self.updates = UpdatePipeline(
            self.learner, self.collection, self.clock, self.watch, self.signals.check
        )
        # What its evaluation rounds and checkpoints work with (`metrics` opens as it starts).
        services = LoopServices(
            config=config,
            learner=self.learner,
            collection=self.collection,
            updates=self.updates,
            progress=self.progress,
            clock=self.clock,
            watch=self.watch,
            signals=self.signals,
            elapsed=self.elapsed,  # a distributed run's: the clock its processes agreed on
            metrics=lambda: self.metrics,
            log=log,
        )
        pending = PendingEvaluations()  # saved by the checkpoints, resent by the rounds
        self.evaluations = EvaluationRounds(services, strategy, pending)
        directory = run_dir / CHECKPOINTS_DIR
        self.checkpoints = RunCheckpoints(services, pending, store, directory, run_dir)

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
                self.evaluations.final()
            except (KeyboardInterrupt, StopRequested) as stop:
                stopped_by = "terminated" if isinstance(stop, StopRequested) else "interrupted"
                self.log(f"stopping: {stopped_by}")
            except WorkerFailed:
                self.checkpoints.save_at_stop("worker failed")
                raise
            except OSError as error:
                raise self.checkpoints.write_failed(error) from None
            self.checkpoints.save_at_stop(stopped_by)
            with self.clock("stopping"):
                worker_stats = self.collection.stop()
            return self._summary(stopped_by, worker_stats)

    def _start(self, running: contextlib.ExitStack) -> None:
        """Everything before the loop: the config and members written, and the contexts the
        loop runs in entered into `running` (signals, phase watch, metrics, the collection)."""
        config = self.config
        config_lib.save_config(config, self.run_dir / CONFIG_FILE)
        purge_step, resumed_from = None, self.checkpoints.resumed_from
        if resumed_from is None:
            hparams = self.learner.all_member_hparams()
            # each member's config_index and seed_index
            indices = strategies.member_configurations(config.population)
            labels = self.learner.member_labels() or [{}] * len(hparams)
            write_members(self.run_dir, config.strategy, hparams, indices, labels)
        else:  # rows logged after the checkpoint are written again by this run
            rewind_logs(self.run_dir, resumed_from["logs"])
            purge_step = self.member_env_steps * config.population.size
        running.enter_context(self.signals)
        running.enter_context(self.watch)
        self.metrics = metrics = running.enter_context(self.open_metrics(purge_step))
        generation = self.progress.resumes
        running.enter_context(self.collection.running(self.learner, metrics.log_event, generation))
        if hasattr(self.collection, "stop_check"):  # before its workers are checked
            self.collection.stop_check = self.signals.check
        if resumed_from is not None:
            self.checkpoints.announce_resume()
            self.evaluations.resend()  # results the previous process never received

    def open_metrics(self, purge_step: int | None) -> MetricsWriter:
        trackers = open_trackers(self.config, self.run_dir)
        return MetricsWriter(self.run_dir, self.config.log.tensorboard, False, purge_step, trackers)

    def _loop(self) -> None:
        total = self.config.train.total_env_steps
        max_seconds = self.config.train.max_wall_seconds or math.inf
        evaluations = self.evaluations
        # The loop's own Python counts as `loop`: each phase opened inside it pauses it.
        with self.clock("loop"), self._learning_ends():
            if self.progress.learning_started_at is not None:  # resumed: learning from here
                self.progress.window.start = self._clock_reading()
            while self.member_env_steps < total and self.elapsed() < max_seconds:
                self.signals.check()
                busy = self._collect()  # rows move while the update in flight computes
                # What must see finished updates (a strategy step, the progress line, a
                # checkpoint) waits for the one in flight first.
                evaluations.receive(timeout=0.01 if evaluations.waiting() else 0.0)
                self._progress()
                every, steps = self.config.checkpoint, self.member_env_steps
                if self.progress.checkpoint_due(every, self.elapsed(), steps):
                    self.checkpoints.save("interval")
                if not evaluations.waiting() and self.updates.can_start():
                    self.updates.start()  # then publishes the policies of the update before it
                    self._note_learning_started()  # (after: the first dispatch compiles)
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
            if self.learner.updates:  # device mode: the chunk's call updated
                self._note_learning_started()
            for episode in episodes:
                self.progress.training_returns[episode.member].append(episode.episode_return)
            moved += 1
            self.evaluations.snapshot_if_due()
        return moved > 0

    def _note_learning_started(self) -> None:
        """The learning window opens once the run's first update has been dispatched: what is
        left of compiling it (the dispatch waits for that) stays out of the window."""
        if self.progress.window.start is None:
            self.progress.window.start = reading = self._clock_reading()
            if self.progress.learning_started_at is None:
                self.progress.learning_started_at = reading.elapsed

    @contextlib.contextmanager
    def _learning_ends(self):
        """The learning window closes as the loop ends, its last update done (however it
        ends: a stop asked for mid-loop too)."""
        try:
            yield
        finally:
            self.progress.window.end = self._clock_reading()

    def _clock_reading(self) -> progress_lib.ClockReading:
        self.clock.lap()  # the timers: every second until now
        return progress_lib.ClockReading(self.elapsed(), dict(self.timers), self.learner.updates)

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

    def _summary(self, stopped_by: str, worker_stats: dict) -> dict:
        summary = progress_lib.run_summary(stopped_by, self.elapsed(), self.learner, self.progress)
        summary |= {
            "collect_mode": self.parts.collection_mode,
            # this process's seconds per phase, and those no phase covered
            "learner_seconds": progress_lib.time_breakdown(self.timers, self.progress.elapsed()),
            "learning_window": self.progress.window.summary(),
            "workers": worker_stats,
        }
        self.log(progress_lib.format_breakdown(summary))
        return summary

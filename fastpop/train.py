"""The training loop: collectors feed the device replay, the learner updates the population.

    drain chunks -> replay.add -> rate limiter -> K-step population update -> publish params
    every eval.interval env steps: snapshot -> evaluator process -> metrics.jsonl
    every checkpoint interval and at every stop: the whole run -> checkpoints/ (run_state.py)

Nothing here is algorithm-specific. The learner owns all device state; collector and evaluator
processes (fastpop.collect) step CPU simulators and talk to it through shared memory.
"""

from __future__ import annotations

import errno
import json
import math
import signal
import time
from collections import deque
from pathlib import Path

import numpy as np

from fastpop import checkpoint, run_state
from fastpop import config as config_lib
from fastpop.collect.evaluator import META_FIELD
from fastpop.collect.workers import WorkerFailed, Workers
from fastpop.learner import Learner, prepare
from fastpop.metrics import MEMBERS_FILE, MetricsWriter, median, rewind_logs
from fastpop.strategies.base import Evaluation

CHECKPOINTS_DIR = "checkpoints"
CONFIG_FILE = "config.yaml"  # the resolved config the run (or its latest resume) started with
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class TrainError(RuntimeError):
    """The run could not go on (a worker failed beyond its restarts); the message says why."""


class StopRequested(Exception):
    """SIGTERM: stop like Ctrl-C does."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
REPEAT_SECONDS = 1.0  # a second stop signal sooner than this is the first one delivered again


def _stop_exception(signum: int) -> BaseException:
    return StopRequested() if signum == signal.SIGTERM else KeyboardInterrupt()


class Run:
    """One training run: the loop, its clock, its outputs."""

    def __init__(self, config: config_lib.Config, run_dir: Path, log=print):
        self.config = config
        self.run_dir = run_dir
        self.log = log
        self.spec, agent = prepare(config)
        self.learner = Learner(config, self.spec, agent)
        self.start = time.monotonic()
        self.timers = {"transport": 0.0, "update": 0.0, "evaluation_snapshots": 0.0}
        self.timers |= {"checkpoints": 0.0, "idle": 0.0}
        self.strategy = self.learner.strategy
        self.training_done = False  # no strategy steps on the final evaluation
        self.stop_signal: int | None = None  # SIGINT / SIGTERM received
        # From the loop on, a signal stops at the next safe point (see _on_signal).
        self.in_loop = False
        self.stopped_at_once = False
        self.stop_requested_at = 0.0
        self.checkpoint_dir = run_dir / CHECKPOINTS_DIR
        self.last_checkpoint = (0.0, 0)  # (elapsed seconds, member env steps) at the last save
        self.resumed_from: dict | None = None  # what a resume restored (see `restore`)
        self.resumes = 0
        self.next_eval = self.strategy.evaluation_interval
        self.eval_index = 0
        self.snapshot_env_steps = -1  # member env steps of the latest evaluation snapshot
        # eval index -> (snapshot arrays, member hparams at the snapshot), until its result is in;
        # kept so that a restarted evaluator can be given the snapshots its predecessor lost.
        self.pending_evals: dict[int, tuple[dict, list[dict]]] = {}
        self.evaluator_restarts_seen = 0
        self.latest_returns = np.full(config.population.size, np.nan)
        self.training_returns: list[deque] = [
            deque(maxlen=10) for _ in range(config.population.size)
        ]
        self.last_progress = self.start
        self.learning_started_at: float | None = None  # wall time of the first update

    @property
    def member_env_steps(self) -> int:
        return self.learner.limiter.inserted

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def run(self) -> dict:
        config = self.config
        config_lib.save_config(config, self.run_dir / CONFIG_FILE)
        purge_step = None
        if self.resumed_from is None:
            hparams = self.learner.all_member_hparams()
            members = [{"member": m, "hparams": h} for m, h in enumerate(hparams)]
            members_text = json.dumps({"strategy": config.strategy, "members": members}, indent=1)
            (self.run_dir / MEMBERS_FILE).write_text(members_text + "\n")
        else:  # rows logged after the checkpoint are written again by this run
            rewind_logs(self.run_dir, self.resumed_from["logs"])
            purge_step = self.member_env_steps * config.population.size
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        stopped_by = "completed"
        try:
            with (
                MetricsWriter(
                    self.run_dir, tensorboard=config.log.tensorboard, purge_step=purge_step
                ) as metrics,
                Workers(
                    config,
                    self.learner.policy_leaves(),
                    self.spec,
                    self.log,
                    log_event=metrics.log_event,
                    generation=self.resumes,
                ) as workers,
            ):
                self.metrics, self.workers = metrics, workers
                self._announce_resume()
                try:
                    self.in_loop = True
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
                self.worker_stats = workers.stop()
                summary = self._summary(stopped_by)
        finally:
            self.in_loop = False
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return summary

    def _on_signal(self, signum, frame) -> None:
        """From the loop on, the first signal asks for a stop at the loop's next check (the
        state is consistent there, so the stop checkpoint can be written). A signal within
        REPEAT_SECONDS of it is the same request delivered twice (to the whole process group,
        or forwarded by a wrapper such as timeout or a batch system) and is ignored; a later
        one stops at once, without the checkpoint. Before the loop every signal stops at once.
        Raising is remembered too: an exception raised while Python runs a finalizer or a gc
        callback (e.g. XLA's) is printed and dropped, and the loop must still stop."""
        now = time.monotonic()
        if self.in_loop:
            if self.stop_signal is None:
                self.stop_signal, self.stop_requested_at = signum, now
                return
            if now - self.stop_requested_at < REPEAT_SECONDS:
                return
            self.stopped_at_once = True
        self.stop_signal = signum
        raise _stop_exception(signum)

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise _stop_exception(self.stop_signal)

    # --- checkpoints ---

    def _checkpoint_due(self) -> bool:
        every = self.config.checkpoint
        seconds, steps = self.last_checkpoint
        return (
            every.interval_seconds is not None
            and self.elapsed() - seconds >= every.interval_seconds
        ) or (
            every.interval_env_steps is not None
            and self.member_env_steps - steps >= every.interval_env_steps
        )

    def save_checkpoint(self, reason: str) -> Path:
        """The whole run as it is now: see fastpop.run_state for what goes where."""
        start = time.perf_counter()
        with_replay = self.config.checkpoint.replay
        tree, metadata = run_state.capture(self, reason)
        path = checkpoint.save(
            self.checkpoint_dir, self.member_env_steps, tree, metadata, self.config.checkpoint.keep
        )
        seconds = time.perf_counter() - start
        self.timers["checkpoints"] += seconds
        self.last_checkpoint = (self.elapsed(), self.member_env_steps)
        size = sum(f.stat().st_size for f in path.iterdir())
        self.metrics.log_event(
            "checkpoint",
            {"path": str(path), "reason": reason, "member_env_steps": self.member_env_steps}
            | {"seconds": seconds, "bytes": size, "replay": with_replay},
        )
        self.log(f"checkpoint {path} ({reason}; {size / 1e6:,.1f} MB in {seconds:.1f}s)")
        return path

    def _stop_checkpoint(self, reason: str) -> None:
        if self.stopped_at_once:
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
        """Continue from a checkpoint (before `run`)."""
        run_state.apply(self, tree, metadata)
        self.resumed_from = {"path": str(path), "logs": metadata["logs"], **metadata["run"]}

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
        for index in sorted(self.pending_evals):  # results the previous process never received
            self.workers.evaluate(self.pending_evals[index][0])

    def _loop(self) -> None:
        learner, total = self.learner, self.config.train.total_env_steps
        max_seconds = self.config.train.max_wall_seconds or math.inf
        while self.member_env_steps < total and self.elapsed() < max_seconds:
            self._check_stop()
            self.workers.check()
            busy = self._collect()
            waiting = self.strategy.waits_for_evaluation and bool(self.pending_evals)
            if learner.limiter.can_sample() and not waiting:
                start = time.perf_counter()
                if self.learning_started_at is None:
                    self.learning_started_at = self.elapsed()
                learner.update()
                self.workers.publish(learner.policy_leaves())
                self.timers["update"] += time.perf_counter() - start
                busy = True
            self._receive_evaluations(timeout=0.01 if waiting else 0.0)
            self._progress()
            if self._checkpoint_due():
                self.save_checkpoint("interval")
            if not busy:
                start = time.perf_counter()
                time.sleep(0.001)
                self.timers["idle"] += time.perf_counter() - start

    def _collect(self) -> bool:
        """Moves complete chunks (one per collector) into the replay while the limiter allows."""
        moved = False
        start = time.perf_counter()
        while (
            self.learner.limiter.can_insert()
            and self.member_env_steps < self.config.train.total_env_steps
        ):
            rows, episodes = self.workers.next_chunk()
            if rows is None:
                break
            self.learner.insert(rows)
            for episode in episodes:
                self.training_returns[episode.member].append(episode.episode_return)
            moved = True
            if self.member_env_steps >= self.next_eval:
                self._snapshot_for_evaluation()
                self.next_eval += self.strategy.evaluation_interval
        self.timers["transport"] += time.perf_counter() - start
        return moved

    def _snapshot_for_evaluation(self) -> None:
        start = time.perf_counter()
        meta = np.array(
            [
                self.eval_index,
                self.member_env_steps * self.config.population.size,
                self.learner.updates,
                self.elapsed(),
            ],
            np.float64,
        )
        arrays = {f"leaf_{i}": leaf for i, leaf in enumerate(self.learner.policy_leaves())}
        arrays[META_FIELD] = meta
        self.workers.evaluate(arrays)
        self.snapshot_env_steps = self.member_env_steps
        hparams = [
            self.learner.member_hparams_values(m) for m in range(self.config.population.size)
        ]
        self.pending_evals[self.eval_index] = (arrays, hparams)
        self.eval_index += 1
        self.timers["evaluation_snapshots"] += time.perf_counter() - start

    def _resend_lost_snapshots(self) -> None:
        """After an evaluator restart, hand every unanswered snapshot to the new one (those still
        in the ring are evaluated twice; the second result is ignored)."""
        if self.workers.evaluator_restarts == self.evaluator_restarts_seen:
            return
        self.evaluator_restarts_seen = self.workers.evaluator_restarts
        for index in sorted(self.pending_evals):
            self.workers.evaluate(self.pending_evals[index][0])

    def _receive_evaluations(self, timeout: float = 0.0) -> None:
        self._resend_lost_snapshots()
        for result in self.workers.evaluations(timeout):
            if result["eval_index"] not in self.pending_evals:
                continue  # a duplicate after an evaluator restart
            _, hparams = self.pending_evals.pop(result["eval_index"])
            size = self.config.population.size
            self.latest_returns = np.array(result["return_mean"])
            rows = [
                {
                    "eval_index": result["eval_index"],
                    "wall_time": result["wall_time"],
                    "env_steps": result["env_steps"],
                    "member_env_steps": result["env_steps"] // size,
                    "updates": result["updates"],
                    "member": member,
                    "return_mean": result["return_mean"][member],
                    "return_std": result["return_std"][member],
                    "episodes": self.config.eval.episodes,
                    "hparams": hparams[member],
                }
                for member in range(size)
            ]
            self.metrics.log_evaluation(rows)
            if not self.training_done:
                self._strategy_step(result)

    def _strategy_step(self, result: dict) -> None:
        """Hand the round to the strategy; apply its selection on device and log its lineage."""
        learner = self.learner
        returns = np.array(result["return_mean"], np.float64)
        finite = learner.finite_members()
        for member in np.flatnonzero(~finite):
            self.metrics.log_event("non_finite_member", {"member": int(member)})
        member_steps = result["env_steps"] // len(returns)
        evaluation = Evaluation(result["eval_index"], member_steps, returns, finite)
        events, scalars = learner.strategy_step(evaluation)
        if events or scalars:
            self.workers.publish(learner.policy_leaves())
        now, env_steps = self.elapsed(), self.member_env_steps * len(returns)
        self.metrics.log_lineage([{"wall_time": now, "env_steps": env_steps, **e} for e in events])
        if scalars:
            self.metrics.log_scalars(result["env_steps"], scalars)

    def _final_evaluation(self) -> None:
        """Evaluate the final policies (unless the last interval snapshot was taken at the final
        env step count) and wait for all."""
        self.training_done = True
        if self.snapshot_env_steps < self.member_env_steps:
            self._snapshot_for_evaluation()
        deadline = time.monotonic() + 600
        while self.pending_evals and time.monotonic() < deadline:
            self._check_stop()
            self.workers.check()
            self._receive_evaluations(timeout=0.1)

    def _progress(self) -> None:
        now = time.monotonic()
        if now - self.last_progress < self.config.log.progress_interval_seconds:
            return
        self.last_progress = now
        learner, size = self.learner, self.config.population.size
        elapsed = self.elapsed()
        env_steps = self.member_env_steps * size
        fraction = self.member_env_steps / self.config.train.total_env_steps
        seconds_left = elapsed * (1 - fraction) / fraction if fraction > 0 else math.inf
        if self.config.train.max_wall_seconds is not None:
            seconds_left = min(seconds_left, self.config.train.max_wall_seconds - elapsed)
        left = f"~{seconds_left:.0f}s left" if math.isfinite(seconds_left) else "starting"
        returns = self.latest_returns
        if np.all(np.isnan(returns)):
            returns = np.array([np.mean(r) if r else np.nan for r in self.training_returns])
        finite = returns[np.isfinite(returns)]
        best = f"{finite.max():.1f}" if finite.size else "-"
        middle = f"{median(finite.tolist()):.1f}" if finite.size else "-"
        self.log(
            f"[{elapsed:6.0f}s] {env_steps:,} env steps ({env_steps / elapsed:,.0f}/s) | "
            f"{learner.updates:,} updates/member ({learner.updates * size / elapsed:,.0f} "
            f"agent-updates/s) | return best {best} median {middle} | {left}"
        )
        if learner.last_metrics:
            self.metrics.log_scalars(env_steps, learner.last_metrics)

    def _summary(self, stopped_by: str) -> dict:
        limiter = self.learner.limiter
        summary = {
            "stopped_by": stopped_by,
            "wall_time": self.elapsed(),
            "member_env_steps": self.member_env_steps,
            "updates_per_member": self.learner.updates,
            "learning_started_at": self.learning_started_at,
            "samples_per_insert_target": limiter.samples_per_insert,
            "samples_per_insert_achieved": limiter.achieved_samples_per_insert,
            "learner_seconds": self.timers,
            "workers": self.worker_stats,
        }
        self.log(format_breakdown(summary))
        return summary


def format_breakdown(summary: dict) -> str:
    wall = summary["wall_time"]
    lines = [f"time breakdown over {wall:.1f}s of wall time:"]
    for name, seconds in summary["learner_seconds"].items():
        lines.append(f"  learner {name:22s} {seconds:8.1f}s  {100 * seconds / wall:5.1f}%")
    for name, stats in summary["workers"].items():
        parts = ", ".join(
            f"{k.removesuffix('_seconds')} {v:.1f}s"
            for k, v in stats.items()
            if k.endswith("_seconds")
        )
        lines.append(f"  {name:30s} {parts}")
    achieved = summary["samples_per_insert_achieved"]
    lines.append(
        f"  samples per insert: {achieved:.1f} achieved, "
        f"{summary['samples_per_insert_target']:.1f} target"
    )
    return "\n".join(lines)

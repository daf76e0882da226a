"""The training loop: collectors feed the device replay, the learner updates the population.

    drain chunks -> replay.add -> rate limiter -> K-step population update -> publish params
    every eval.interval env steps: snapshot -> evaluator process -> metrics.jsonl

Nothing here is algorithm-specific. The learner owns all device state; collector and evaluator
processes (fastpop.collect) step CPU simulators and talk to it through shared memory.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections import deque
from pathlib import Path

import numpy as np

from fastpop import config as config_lib
from fastpop.collect.evaluator import META_FIELD
from fastpop.collect.workers import Workers
from fastpop.learner import Learner, prepare
from fastpop.metrics import MEMBERS_FILE, MetricsWriter, median
from fastpop.strategies.base import Evaluation


class TrainError(RuntimeError):
    """The run could not go on (a worker failed beyond its restarts); the message says why."""


class StopRequested(Exception):
    """SIGTERM: stop like Ctrl-C does."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
        self.timers = {"transport": 0.0, "update": 0.0, "evaluation_snapshots": 0.0, "idle": 0.0}
        self.strategy = self.learner.strategy
        self.training_done = False  # no strategy steps on the final evaluation
        self.stop_signal: int | None = None  # SIGINT / SIGTERM received
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
        config_lib.save_config(config, self.run_dir / "config.yaml")
        members = [
            {"member": m, "hparams": h} for m, h in enumerate(self.learner.all_member_hparams())
        ]
        members_text = json.dumps({"strategy": config.strategy, "members": members}, indent=1)
        (self.run_dir / MEMBERS_FILE).write_text(members_text + "\n")
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        stopped_by = "completed"
        try:
            with (
                MetricsWriter(self.run_dir, tensorboard=config.log.tensorboard) as metrics,
                Workers(
                    config,
                    self.learner.policy_leaves(),
                    self.spec,
                    self.log,
                    log_event=metrics.log_event,
                ) as workers,
            ):
                self.metrics, self.workers = metrics, workers
                try:
                    self._loop()
                    self._final_evaluation()
                except (KeyboardInterrupt, StopRequested) as stop:
                    stopped_by = "terminated" if isinstance(stop, StopRequested) else "interrupted"
                    self.log(f"stopping: {stopped_by}")
                self.worker_stats = workers.stop()
                summary = self._summary(stopped_by)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return summary

    def _on_signal(self, signum, frame) -> None:
        """Stop at once, and remember it: an exception raised while Python runs a finalizer or
        a gc callback (e.g. XLA's) is printed and dropped, and the loop must still stop."""
        self.stop_signal = signum
        raise _stop_exception(signum)

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise _stop_exception(self.stop_signal)

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
        returns[~finite] = np.nan  # ranks last; PBT replaces it
        evaluation = Evaluation(result["eval_index"], result["env_steps"] // len(returns), returns)
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

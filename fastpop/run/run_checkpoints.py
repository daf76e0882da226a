"""When a run writes its checkpoints and what it says of them: every checkpoint interval and at
every stop (none when stopped at once), a failed write named with the newest checkpoint left
intact, and a resumed run restored from the newest one that reads back whole.

What a checkpoint holds is fastpop.run.run_state's; where it goes, the run's `CheckpointStore`'s
(fastpop.run.checkpoint, or every process's shards in a distributed run).
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

from fastpop.run import checkpoint, run_state
from fastpop.run.checkpoint import CheckpointStore
from fastpop.run.evaluation_rounds import LoopServices
from fastpop.run.progress import PendingEvaluations
from fastpop.run.stop_signals import StopRequested

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class TrainError(RuntimeError):
    """The run could not go on (a worker failed beyond its restarts); the message says why."""


class RunCheckpoints:
    """The checkpoints of a run (`services`, with the evaluations it has not had answered:
    `pending`): written into `store`; `directory` is where a stop that writes none looks for the
    newest complete one; `run_dir` is what `fastpop resume` continues."""

    def __init__(
        self,
        services: LoopServices,
        pending: PendingEvaluations,
        store: CheckpointStore,
        directory: Path,
        run_dir: Path,
    ):
        self.services, self.store, self.directory, self.run_dir = (
            services,
            store,
            directory,
            run_dir,
        )
        self.state = run_state.RunState(
            services.config, services.learner, services.collection, services.progress, pending
        )
        self.resumed_from: dict | None = None  # what a resume restored (see `restore`)

    def save(self, reason: str) -> Path:
        """The whole run as it is now, its updates done: see fastpop.run.run_state for what
        goes where."""
        services, learner = self.services, self.services.learner
        services.updates.wait(check=False)
        start = time.perf_counter()
        with_replay = services.config.checkpoint.replay
        with (
            services.clock("checkpoints"),
            services.watch.phase(f"writing a checkpoint ({reason})"),
        ):
            services.clock.lap()  # the timers it saves: every second until now
            metrics = services.metrics()
            tree, metadata = run_state.capture(self.state, reason, metrics.lengths())
            path = self.store.save(learner.member_env_steps, tree, metadata)
        seconds = time.perf_counter() - start
        services.progress.last_checkpoint = (services.elapsed(), learner.member_env_steps)
        fields, written = self.store.describe(path)
        metrics.log_event(
            "checkpoint",
            {"path": str(path), "reason": reason, "member_env_steps": learner.member_env_steps}
            | {"seconds": seconds, **fields, "replay": with_replay},
        )
        services.log(f"checkpoint {path} ({reason}; {written} in {seconds:.1f}s)")
        return path

    def save_at_stop(self, reason: str) -> None:
        """The checkpoint of a stop, unless the run was stopped at once (before it, or by a
        signal repeated while it is written)."""
        log = self.services.log
        if self.services.signals.stopped_at_once:
            log(f"stopped at once: no checkpoint written ({self.newest()})")
            return
        try:
            self.save(reason)
        except OSError as error:
            raise self.write_failed(error) from None
        except (KeyboardInterrupt, StopRequested):  # a repeated signal: stop at once
            log(f"stopped at once: checkpoint abandoned ({self.newest()})")
            return
        if reason != "completed":
            log(f"continue it with: fastpop resume {self.run_dir}")

    def newest(self) -> str:
        newest = checkpoint.complete_checkpoints(self.directory)
        return f"newest complete checkpoint: {newest[0]}" if newest else "no checkpoint yet"

    def write_failed(self, error: OSError) -> TrainError:
        what = "the disk is full" if error.errno in DISK_FULL else "a write failed"
        return TrainError(
            f"stopping: {what} ({error}); {self.newest()} (intact; resume from "
            f"it with `fastpop resume {self.run_dir}` once there is room)"
        )

    def template(self, metadata: dict) -> dict:
        return run_state.template(self.state, metadata)

    def restore(self, tree: dict, metadata: dict, path: Path) -> None:
        """Continue from a checkpoint (before the run starts): the learner and the collection
        restore their own state, the run's progress and pending evaluations are restored in
        place (fastpop.run.run_state)."""
        run_state.restore(self.state, tree, metadata)
        self.resumed_from = {"path": str(path), "logs": metadata["logs"], **metadata["run"]}

    def restore_latest(self, warn=print) -> Path:
        """Continue from the newest checkpoint that reads back whole; returns its path."""
        tree, metadata, path = self.store.restore_latest(self.template, warn)
        self.restore(tree, metadata, path)
        return path

    def announce_resume(self) -> None:
        """A resumed run's line and event (its unanswered snapshots are the evaluation
        rounds' to hand out again: `EvaluationRounds.resend`)."""
        services, resumed = self.services, self.resumed_from
        if resumed is None:
            return
        replay = (
            "replay restored"
            if resumed["replay_saved"]
            else "replay not saved (checkpoint.replay: false): the buffers refill from the "
            f"collectors, learning waits for replay.min_size={services.config.replay.min_size}"
        )
        steps, updates = services.learner.member_env_steps, services.learner.updates
        services.log(
            f"resumed from {resumed['path']}: {steps:,} env steps per member, "
            f"{updates:,} updates, {resumed['elapsed']:.0f}s of wall time; {replay}"
        )
        services.metrics().log_event(
            "resumed",
            {"path": resumed["path"], "member_env_steps": steps}
            | {"wall_time": resumed["elapsed"], "replay_restored": resumed["replay_saved"]},
        )

"""A run's clock and counters, and the evaluation rounds it still waits for: what a checkpoint
saves and restores of the run itself (the learner saves its own state)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from typing import NamedTuple

import numpy as np

from fastpop.collect import snapshot
from fastpop.learn import member_clocks
from fastpop.run.run_files import median
from fastpop.strategies.base import Evaluation

TRAINING_RETURNS_KEPT = 10  # recent training episodes per member, for the progress line
# The run's time breakdown (`PhaseClock`): where its wall time went, each second counted once.
TIMERS = (
    "starting",  # from the run's start to its loop: workers started, programs compiled ahead
    "transport",  # rows from the collectors' rings into the replay
    "update_dispatch",  # deciding on an update and handing it to the device (the first: its
    # compile; until learning starts, the replay's sizes read from the device)
    "update_wait",  # the host waiting for the device to finish an update
    "publish_copy",  # the new policies' device-to-host copy (once their update is done)
    "publish_write",  # their write into shared memory, for the collectors
    "evaluation_snapshots",  # policies handed to the evaluator
    "evaluation_results",  # its results received and logged (waited for, where a strategy waits)
    "strategies",  # strategy steps
    "progress",  # progress lines and the learner's metrics
    "checkpoints",
    "idle",  # nothing to do: no rows to move, no update the rate limiter allows
    "loop",  # the loop's own Python between those phases: stop checks, the evaluation and
    # checkpoint schedules, the limiter's decisions (each phase above pauses it)
    "final_evaluation",  # waiting for the final evaluation after training
    "stopping",  # the workers stopped
)


@dataclasses.dataclass
class RunProgress:
    """Where a run is, besides the learner: wall time, evaluation schedule, returns so far."""

    size: int  # population size
    next_eval: int  # member env steps of the next evaluation snapshot
    elapsed_before: float = 0.0  # wall seconds of earlier processes of this run (resumes)
    started: float = dataclasses.field(default_factory=time.monotonic)
    eval_index: int = 0  # of the next snapshot
    snapshot_env_steps: int = -1  # member env steps of the latest snapshot
    learning_started_at: float | None = None  # wall time of the first update
    resumes: int = 0
    timers: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(TIMERS, 0.0))
    latest_returns: np.ndarray = None  # (P,) latest evaluation's mean returns
    training_returns: list = None  # per member, the recent training episodes' returns
    last_checkpoint: tuple[float, int] = (0.0, 0)  # (elapsed, member env steps) at the last save
    # eval index -> the evaluation timer when its snapshot was taken (not saved: see below)
    evaluation_seconds_at: dict = dataclasses.field(default_factory=dict)
    window: LearningWindow = None  # this process's learning window (not saved)

    def __post_init__(self):
        if self.latest_returns is None:
            self.latest_returns = np.full(self.size, np.nan)
        if self.training_returns is None:
            self.training_returns = [deque(maxlen=TRAINING_RETURNS_KEPT) for _ in range(self.size)]
        if self.window is None:
            self.window = LearningWindow()

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def evaluation_seconds_before(self, eval_index: int) -> float:
        """The learner's seconds on evaluations before snapshot `eval_index` was taken, at its
        rows' wall_time (device mode evaluates in the loop, each right after its snapshot: the
        window between two rows holds the evaluations of those taken in it); for a snapshot of
        an earlier process of the run (a resume), its seconds so far."""
        now = self.timers["evaluation_snapshots"]
        return self.evaluation_seconds_at.pop(eval_index, now)

    def checkpoint_due(self, every, elapsed: float, member_env_steps: int) -> bool:
        """`every` (config.checkpoint)'s interval in seconds or env steps has passed (`elapsed`:
        the run's clock, which processes of a distributed run agree on)."""
        seconds, steps = self.last_checkpoint
        return (
            every.interval_seconds is not None and elapsed - seconds >= every.interval_seconds
        ) or (
            every.interval_env_steps is not None
            and member_env_steps - steps >= every.interval_env_steps
        )

    def returns_so_far(self) -> np.ndarray:
        """(P,) the latest evaluation's returns, else the recent training episodes' means."""
        if not np.all(np.isnan(self.latest_returns)):
            return self.latest_returns
        return np.array([np.mean(r) if r else np.nan for r in self.training_returns])

    def saved(self) -> dict:
        """Plain JSON data (the `run` part of a checkpoint's metadata)."""
        return {
            "elapsed": self.elapsed(),
            "eval_index": self.eval_index,
            "next_eval": self.next_eval,
            "snapshot_env_steps": self.snapshot_env_steps,
            "learning_started_at": self.learning_started_at,
            "latest_returns": self.latest_returns.tolist(),
            "training_returns": [list(returns) for returns in self.training_returns],
            "timers": self.timers,
            "resumes": self.resumes,
        }

    @classmethod
    def restored(cls, data: dict, size: int, member_env_steps: int) -> RunProgress:
        """A new process continuing from `saved()` data: wall time continues from its total."""
        return cls(
            size=size,
            next_eval=data["next_eval"],
            elapsed_before=data["elapsed"],
            eval_index=data["eval_index"],
            snapshot_env_steps=data["snapshot_env_steps"],
            learning_started_at=data["learning_started_at"],
            resumes=data["resumes"] + 1,
            timers=dict.fromkeys(TIMERS, 0.0) | data["timers"],
            latest_returns=np.array(data["latest_returns"], np.float64),
            training_returns=[
                deque(r, maxlen=TRAINING_RETURNS_KEPT) for r in data["training_returns"]
            ],
            last_checkpoint=(data["elapsed"], member_env_steps),
        )

    def continue_from(self, data: dict, member_env_steps: int) -> None:
        """This progress made what `restored` makes of `saved()` data, in place: the parts of
        the run that hold it (its evaluation rounds, checkpoints, clock) see the restored one."""
        restored = self.restored(data, self.size, member_env_steps)
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(restored, field.name))


PENDING_FIELDS = ("eval_index", "hparams", "labels", "facts")  # of a pending round, saved


class PendingEvaluations:
    """Snapshots handed to the evaluator whose results are not in yet, by eval index, with the
    members as they were at the snapshot (hparams, labels, `Learner.snapshot_facts`): kept so
    that a restarted evaluator (or a resumed run) can be given again what its predecessor never
    answered, and so that a result is credited to the policies and hparams it evaluated."""

    def __init__(self):
        # eval index -> (snapshot arrays, member hparams, member labels or None, facts or None)
        self.snapshots: dict[int, tuple] = {}

    def __bool__(self) -> bool:
        return bool(self.snapshots)

    def add(
        self,
        arrays: dict,
        hparams: list[dict],
        labels: list[dict] | None = None,
        facts: dict | None = None,
    ) -> None:
        index = snapshot.decode(arrays)[1].eval_index
        self.snapshots[index] = (arrays, hparams, labels, facts)

    def take(self, eval_index: int) -> tuple | None:
        """(hparams, labels, facts) of the answered snapshot; None for a duplicate answer."""
        entry = self.snapshots.pop(eval_index, None)
        return None if entry is None else entry[1:]

    def in_order(self) -> list[dict]:
        return [self.snapshots[index][0] for index in sorted(self.snapshots)]

    def saved(self) -> tuple[list[dict], list[dict]]:
        """(snapshot arrays, plain data) for a checkpoint, in eval-index order."""
        order = sorted(self.snapshots)
        data = [dict(zip(PENDING_FIELDS, (i, *self.snapshots[i][1:]), strict=True)) for i in order]
        return [self.snapshots[i][0] for i in order], data

    def restore(self, arrays: list[dict], data: list[dict]) -> None:
        """The snapshots `saved()` returned, in place of those held."""
        self.snapshots = {}
        for entry, snapshot_arrays in zip(data, arrays, strict=True):
            kept = entry["hparams"], entry["labels"], entry["facts"]
            self.snapshots[entry["eval_index"]] = (snapshot_arrays, *kept)


def round_evaluation(
    result: dict, returns: np.ndarray, finite: np.ndarray, hparams: list[dict], facts: dict | None
) -> Evaluation:
    """An evaluator's result as the strategy's round: with the members as they were at the
    snapshot (`hparams`, `facts`: `PendingEvaluations.take`'s), which the learner compares with
    what they are now."""
    at_snapshot = {} if facts is None else member_clocks.evaluation_fields(facts)
    member_steps = result["env_steps"] // len(returns)
    return Evaluation(result["eval_index"], member_steps, returns, finite, hparams, **at_snapshot)


def evaluation_rows(
    result: dict,
    hparams: list[dict],
    episodes: int,
    labels: list[dict] | None = None,
    evaluation_seconds: float | None = None,
) -> list[dict]:
    """metrics.jsonl rows (one per member) of one evaluation result; `labels`: per member,
    fields of the strategy's (halving's trial) put beside `member`; `evaluation_seconds`:
    `RunProgress.evaluation_seconds_before`'s, as `learner_evaluation_seconds`."""
    timing = (
        {} if evaluation_seconds is None else {"learner_evaluation_seconds": evaluation_seconds}
    )
    size = len(result["return_mean"])
    labels = labels or [{}] * size
    return [
        {
            "eval_index": result["eval_index"],
            "wall_time": result["wall_time"],
            "env_steps": result["env_steps"],
            "member_env_steps": result["env_steps"] // size,
            "updates": result["updates"],
            "member": member,
            **labels[member],
            "return_mean": result["return_mean"][member],
            "return_std": result["return_std"][member],
            "episodes": episodes,
            "hparams": hparams[member],
            **timing,
        }
        for member in range(size)
    ]


# Device mode's chunk calls (rows and insert; updates) are timed where process mode times the
# transport of rows, and its evaluations run in the loop; calls are dispatched asynchronously,
# so device time lands wherever the host next waits for a result.
DEVICE_TIMER_LABELS = {"transport": "chunk calls", "evaluation_snapshots": "evaluations"}
# Device mode updates inside its chunk calls and acts with the learner's own states.
PROCESS_MODE_TIMERS = ("update_dispatch", "update_wait", "publish_copy", "publish_write")


def progress_line(
    elapsed: float, env_steps: int, updates: int, size: int, returns: np.ndarray, left: str
) -> str:
    """The periodic progress line: env steps and updates (per member) with their rates, the
    best and median return of the `size` members."""
    finite = returns[np.isfinite(returns)]
    best = f"{finite.max():.1f}" if finite.size else "-"
    middle = f"{median(finite.tolist()):.1f}" if finite.size else "-"
    return (
        f"[{elapsed:6.0f}s] {env_steps:,} env steps ({env_steps / elapsed:,.0f}/s) | "
        f"{updates:,} updates/member ({updates * size / elapsed:,.0f} "
        f"agent-updates/s) | return best {best} median {middle} | {left}"
    )


def time_breakdown(timers: dict, wall_time: float) -> dict:
    """Seconds per phase (`timers`), and `other`: the part of `wall_time` no phase covered
    (outside the loop: the run's setup and its summary)."""
    return timers | {"other": wall_time - sum(timers.values())}


class ClockReading(NamedTuple):
    """The run's clock at one moment: its wall time, its seconds per phase, updates per member."""

    elapsed: float
    timers: dict
    updates: int


@dataclasses.dataclass
class LearningWindow:
    """This process's learning window: from the run's first update dispatched, its compile
    done (a resumed run's: from its loop's start) to the loop's end, its last update done;
    the final evaluation, the stop's checkpoint and the workers' stop come after it. Not saved
    in checkpoints."""

    start: ClockReading | None = None
    end: ClockReading | None = None

    def summary(self) -> dict | None:
        """Its ends, its seconds per phase (`TIMERS`; those of interval checkpoints and
        evaluation rounds taken in it included) and the updates per member made in it; None
        where no update ran in this process."""
        start, end = self.start, self.end
        if start is None or end is None:
            return None
        seconds = {name: end.timers[name] - start.timers.get(name, 0.0) for name in end.timers}
        return {
            "started_at": start.elapsed,
            "ended_at": end.elapsed,
            "seconds": seconds,
            "updates_per_member": end.updates - start.updates,
        }


def run_summary(stopped_by: str, wall_time: float, learner, progress: RunProgress) -> dict:
    """summary.json's run fields (the caller adds its collection mode and workers' stats)."""
    limiter = learner.limiter
    return {
        "stopped_by": stopped_by,
        "wall_time": wall_time,
        "member_env_steps": learner.member_env_steps,
        "updates_per_member": learner.updates,
        "learning_started_at": progress.learning_started_at,
        "samples_per_insert_target": limiter.samples_per_insert,
        "samples_per_insert_achieved": limiter.achieved_samples_per_insert,
    }


def format_breakdown(summary: dict) -> str:
    wall = summary["wall_time"]
    device = summary.get("collect_mode") == "device"
    lines = [f"time breakdown over {wall:.1f}s of wall time:"]
    if device:
        lines.append("  (device mode: calls run asynchronously; time lands where the host waits)")
    for name, seconds in summary["learner_seconds"].items():
        if device and name in PROCESS_MODE_TIMERS:
            continue
        label = DEVICE_TIMER_LABELS.get(name, name) if device else name
        lines.append(f"  learner {label:22s} {seconds:8.1f}s  {100 * seconds / wall:5.1f}%")
    for name, stats in summary["workers"].items():
        parts = ", ".join(
            f"{k.removesuffix('_seconds')} {v:.1f}s"
            for k, v in stats.items()
            if k.endswith("_seconds")
        )
        lines.append(f"  {name:30s} {parts}")
    lines.append(f"  {samples_per_insert_line(summary)}")
    return "\n".join(lines)


def samples_per_insert_line(summary: dict) -> str:
    """The achieved samples per insert against the target, or why there is none (nan: no
    update ran, or nothing was inserted after learning started)."""
    achieved = summary["samples_per_insert_achieved"]
    target = summary["samples_per_insert_target"]
    if math.isfinite(achieved):
        return f"samples per insert: {achieved:.1f} achieved, {target:.1f} target"
    if not summary.get("updates_per_member"):
        return (
            f"samples per insert: no update ran (they start once replay.min_size transitions "
            f"per member are in), {target:.1f} target"
        )
    return (
        "samples per insert: none measured (nothing inserted since learning started), "
        f"{target:.1f} target"
    )


def late_evaluations_line(late: int, strategy: str) -> str | None:
    """What a run says when `late` evaluations taken during training came back after it ended:
    its strategy made no step on them (independent members have none to make)."""
    from fastpop.strategies import registry

    if not late or not (entry := registry.get(strategy)).acts_on_evaluations:
        return None
    wait = entry.wait_option
    hint = f" ({wait}: true makes the learner wait for each)" if wait else ""
    return (
        f"{late} evaluation(s) taken during training came back after it ended: the {strategy} "
        f"strategy made no step on them{hint}"
    )

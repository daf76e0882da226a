"""Run metrics: one JSONL row per member per evaluation, TensorBoard scalars, an event log.

A run directory receives
  metrics.jsonl  one row per member per evaluation round (schema below), flushed every round
  scalars.jsonl  learner scalars (losses, rates) as {"step": ..., name: value, ...}
  events.jsonl   collector restarts, non-finite members, other notes
  lineage.jsonl  strategy events: who copied whom, when, old -> new hparams, the deciding returns
  summary.json   written at the end (`write_summary`): what the run did, its time breakdown, the
                 programs it compiled and loaded
  events.out.tfevents.*  the same evaluation and learner scalars for TensorBoard

Trackers (`Tracker`: TensorBoard's HParams view, Weights & Biases; fastpop.run.trackers) receive the
same calls; one that fails is dropped with a warning and an event, and the run goes on.

Everything written is plain JSON. NaN and infinities have no JSON spelling, so they are written
as null and read back as NaN (an infinite return is not a result anyone needs to keep).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from fastpop.compilation import compile_stats
from fastpop.run.ranking import is_number
from fastpop.run.run_files import (
    EVENTS_FILE,
    LINEAGE_FILE,
    MEMBERS_FILE,
    METRICS_FILE,
    SCALARS_FILE,
    SUMMARY_FILE,
    finite_returns,
    median,
    read_metrics,
)

# Fields every evaluation row carries (the writer adds `eval_index`, shared by one round, when
# absent). wall_time: seconds since run start, compilation and collection included; env_steps:
# over the whole population; member_env_steps, updates: this member's; hparams: name -> value.
ROW_FIELDS = ("wall_time", "env_steps", "member_env_steps", "updates", "member")
ROW_FIELDS += ("return_mean", "return_std", "episodes", "hparams")


def write_members(
    run_dir: Path, strategy: str, hparams: list[dict], indices: list[dict], labels: list[dict]
) -> None:
    """`run_dir`/members.json: the strategy, and per member (in member order) its indices
    (config_index, seed_index), its strategy's labels (halving: its trial) and initial hparams."""
    members = [
        {"member": member, **indices[member], **labels[member], "hparams": values}
        for member, values in enumerate(hparams)
    ]
    text = json.dumps({"strategy": strategy, "members": members}, indent=1)
    (Path(run_dir) / MEMBERS_FILE).write_text(text + "\n")


def write_summary(directory: Path, summary: dict) -> None:
    """`directory`/summary.json: `summary` with the programs this process compiled and loaded
    (a run's, or one process's own in a distributed run)."""
    summary["compiles"] = compile_stats.summary()
    text = json.dumps(summary, indent=2, default=float) + "\n"
    (Path(directory) / SUMMARY_FILE).write_text(text)


def _plain(value: Any, field: str) -> Any:
    """`value` as JSON-ready plain data; numpy/JAX scalars unwrapped, non-finite floats -> None."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{field}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{field}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist"):  # numpy / JAX arrays and scalars
        return _plain(value.tolist(), field)
    raise TypeError(f"metrics field {field!r}: {type(value).__name__} is not plain data")


def _drop_partial_tail(path: Path) -> None:
    """Cut an unterminated last line (a crash mid-write) so appended rows start on a new line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


# Logs that follow the run's state: a resume rewinds them to their length at the checkpoint, so
# the resumed run writes each row exactly once. events.jsonl (restarts, stops, resumes) is a
# record of what happened and is never rewound.
REWOUND_FILES = (METRICS_FILE, SCALARS_FILE, LINEAGE_FILE)


def rewind_logs(run_dir: Path, lengths: dict[str, int]) -> dict[str, int]:
    """Cut each of `REWOUND_FILES` back to its length in `lengths`; returns the bytes cut."""
    cut = {}
    for name in REWOUND_FILES:
        path = Path(run_dir) / name
        if path.exists() and path.stat().st_size > lengths.get(name, 0):
            cut[name] = path.stat().st_size - lengths.get(name, 0)
            with path.open("r+b") as f:
                f.truncate(lengths.get(name, 0))
    return cut


@functools.cache
def _tensorboard_installed() -> bool:
    """Whether tensorboardX can be imported, found without importing it (~0.1 s of a start);
    warns once when it cannot."""
    if importlib.util.find_spec("tensorboardX") is not None:
        return True
    warnings.warn(
        "tensorboardX is not installed: writing metrics.jsonl only "
        "(pip install tensorboardX for TensorBoard event files)",
        stacklevel=3,
    )
    return False


class Tracker(Protocol):
    """Another destination for what a `MetricsWriter` logs (rows as written to the files)."""

    def log_evaluation(self, rows: list[dict]) -> None: ...
    def log_scalars(self, step: int, values: dict) -> None: ...
    def log_lineage(self, events: list[dict]) -> None: ...
    def close(self, failed: bool) -> None: ...


class MetricsWriter:
    """Appends evaluation rows, learner scalars and events to a run directory.

    Each `log_*` call is written and flushed before it returns, so a crash loses nothing already
    logged; with `fsync=True` it also survives a machine crash. Reopening an existing run directory
    (resume) appends, and evaluation rounds continue from the last `eval_index`.
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        fsync: bool = False,
        purge_step: int | None = None,
        trackers: Sequence[Tracker] = (),
    ):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        names = (METRICS_FILE, SCALARS_FILE, EVENTS_FILE, LINEAGE_FILE)
        paths = [self.run_dir / name for name in names]
        for path in paths:
            _drop_partial_tail(path)
        previous = read_metrics(paths[0]) if paths[0].exists() else []
        self.next_eval_index = 1 + max((int(r.get("eval_index", -1)) for r in previous), default=-1)
        self._files = [p.open("a", encoding="utf-8") for p in paths]
        self._metrics, self._scalars, self._events, self._lineage = self._files
        # purge_step: TensorBoard hides what an earlier writer logged from this step on (a
        # resume repeats those steps). The writer is opened by the first write (`_board`).
        self._board_wanted = tensorboard and _tensorboard_installed()
        self._purge_step, self._tensorboard = purge_step, None
        self._trackers = list(trackers)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.close(failed=exc_type is not None)

    def _board(self):
        """The TensorBoard writer (None without one), opened by the first write."""
        if self._tensorboard is None and self._board_wanted:
            from tensorboardX import SummaryWriter

            self._tensorboard = SummaryWriter(logdir=str(self.run_dir), purge_step=self._purge_step)
        return self._tensorboard

    def _track(self, method: str, *args) -> None:
        """`method(*args)` on every tracker; a failing one is dropped (the files stay whole)."""
        for tracker in list(self._trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as error:
                self._trackers.remove(tracker)
                name = type(tracker).__name__
                warnings.warn(f"{name} failed and is dropped: {error!r}", stacklevel=3)
                if method != "close":
                    with contextlib.suppress(Exception):
                        tracker.close(True)
                with contextlib.suppress(OSError):  # a full disk is reported by the files
                    self.log_event("tracker_failed", {"tracker": name, "error": repr(error)})

    def _append(self, file, rows: Iterable[dict]) -> None:
        lines = [json.dumps(_plain(row, "row"), allow_nan=False) + "\n" for row in rows]
        file.write("".join(lines))
        file.flush()
        if self.fsync:
            os.fsync(file.fileno())

    def lengths(self) -> dict[str, int]:
        """Bytes written so far to each of `REWOUND_FILES` (for a checkpoint)."""
        files = {METRICS_FILE: self._metrics, SCALARS_FILE: self._scalars}
        files[LINEAGE_FILE] = self._lineage
        return {name: file.tell() for name, file in files.items()}

    def log_evaluation(self, rows: list[dict]) -> None:
        """Write one evaluation round: one row per member (schema: `ROW_FIELDS` + extras)."""
        if not rows:
            return
        for row in rows:
            missing = [name for name in ROW_FIELDS if name not in row]
            if missing:
                raise ValueError(
                    f"evaluation row for member {row.get('member', '?')} lacks {missing}; "
                    f"every row needs {list(ROW_FIELDS)}"
                )
        rows = [{"eval_index": self.next_eval_index, **row} for row in rows]
        self._append(self._metrics, rows)
        self.next_eval_index = 1 + max(int(row["eval_index"]) for row in rows)
        if (board := self._board()) is not None:
            step, scalars = evaluation_scalars(rows)
            for tag, value in scalars.items():
                board.add_scalar(tag, value, step)
            board.flush()
        self._track("log_evaluation", _plain(rows, "rows"))

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        """Learner scalars (`learner/critic_loss`, ...) to scalars.jsonl and TensorBoard."""
        self._append(self._scalars, [{"step": int(step), **values}])
        if (board := self._board()) is not None:
            for name, value in values.items():
                if is_number(value):
                    board.add_scalar(name, float(value), int(step))
        self._track("log_scalars", int(step), _plain(values, "scalars"))

    scalars = log_scalars

    def log_event(self, kind: str, payload: dict) -> None:
        """Append `{"kind": kind, "time": unix seconds, **payload}` to events.jsonl."""
        if "kind" in payload:
            raise ValueError(f"event payload must not have a 'kind' key (event kind {kind!r})")
        self._append(self._events, [{"kind": kind, "time": time.time(), **payload}])

    def log_lineage(self, events: list[dict]) -> None:
        """Strategy events (`target`, `source`, `old_hparams`, `new_hparams`, ...) to
        lineage.jsonl; TensorBoard gets each target's source and new hparams at `env_steps`."""
        if not events:
            return
        self._append(self._lineage, events)
        if (board := self._board()) is not None:
            for event in events:
                step, scalars = lineage_scalars(event)
                for tag, value in scalars.items():
                    board.add_scalar(tag, value, step)
            board.flush()
        self._track("log_lineage", _plain(events, "lineage"))

    def close(self, failed: bool = False) -> None:
        """Close the trackers (`failed`: the run stopped on an error), then the files."""
        self._track("close", failed)
        self._trackers = []
        for file in self._files:
            # Every row is flushed when logged, so a close can only fail by retrying a write
            # that already failed (a full disk), and that error has been raised once already.
            with contextlib.suppress(OSError):
                file.close()
        self._board_wanted = False  # nothing opens a writer after the close
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def evaluation_scalars(rows: list[dict]) -> tuple[int, dict[str, float]]:
    """One evaluation round as tagged scalars (`member_3/return_mean`, `member_3/hparams/actor_lr`,
    `population/best_return`) at its step: the population's env steps."""
    step, scalars = max(int(row["env_steps"]) for row in rows), {}
    for row in rows:
        prefix = f"member_{int(row['member'])}"
        for name, value in row.items():
            if name not in ("member", "env_steps", "eval_index", "hparams") and is_number(value):
                scalars[f"{prefix}/{name}"] = float(value)
        for name, value in row["hparams"].items():
            if is_number(value):
                scalars[f"{prefix}/hparams/{name}"] = float(value)
    returns = finite_returns(rows)
    if returns:
        scalars["population/best_return"] = max(returns)
        scalars["population/median_return"] = median(returns)
    return step, scalars


def lineage_scalars(event: dict) -> tuple[int, dict[str, float]]:
    """One strategy event as its target's scalars (source member, new hparams) at its step."""
    prefix = f"member_{int(event['target'])}"
    scalars = {f"{prefix}/lineage/source": float(event["source"])}
    for name, value in event.get("new_hparams", {}).items():
        if is_number(value):
            scalars[f"{prefix}/lineage/hparams/{name}"] = float(value)
    return int(event["env_steps"]), scalars

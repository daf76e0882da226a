"""Lineage of a population run: who copied whom, and each member's hyperparameters over time.

`lineage.jsonl` (written by the trainer through `MetricsWriter.log_lineage`) holds one event per
strategy decision about a member: `target` continued from `source`'s state at `env_steps` with
`new_hparams`. `fastpop plot --hparams RUN` draws each member's evaluation returns with its copies
marked, its hyperparameter trajectory (from the evaluation rows of metrics.jsonl) and the family
tree of the best member.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from fastpop.run.run_files import LINEAGE_FILE, read_jsonl, read_metrics, summarize

HPARAMS_PLOT = "hparams.png"


class Segment(NamedTuple):
    """The ancestor `member` held the line from `start` to `end` (env steps, whole population)."""

    member: int
    start: int
    end: int


def read_lineage(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / LINEAGE_FILE
    return read_jsonl(path) if path.exists() else []


def ancestry(events: list[dict], member: int, end: int) -> list[Segment]:
    """The chain of members whose state `member` holds at `end`, oldest first: walking back in
    time, each event that overwrote the current member moves the line to its source."""
    segments, current, until = [], member, end
    for event in sorted(events, key=lambda e: e["env_steps"], reverse=True):
        if event["target"] == current and event["env_steps"] <= until:
            segments.append(Segment(current, int(event["env_steps"]), until))
            current, until = int(event["source"]), int(event["env_steps"])
    segments.append(Segment(current, 0, until))
    return segments[::-1]


class Jump(NamedTuple):
    """A copy as a member's return curve shows it: at `env_steps` (whole population) the
    `target` member, which returned `target_return` at the evaluation that decided the copy,
    continues from a member that returned `source_return` there."""

    target: int
    env_steps: int
    target_return: float
    source_return: float


def copy_jumps(rows: list[dict], events: list[dict]) -> list[Jump]:
    """The jumps of the events that moved a member onto another's state (not a halving trial's
    fresh start, its own slot), read from the deciding evaluation's rows; events whose rows
    are missing are left out."""
    returns = {(r.get("eval_index"), int(r["member"])): r["return_mean"] for r in rows}
    jumps = []
    for event in events:
        target, source = event["target"], event.get("source", event["target"])
        key = event.get("eval_index")
        if target != source and (key, target) in returns and (key, source) in returns:
            target_return, source_return = float(returns[key, target]), float(returns[key, source])
            jumps.append(Jump(target, int(event["env_steps"]), target_return, source_return))
    return jumps


def hparam_trajectories(rows: list[dict]) -> dict[str, dict[int, tuple[list, list]]]:
    """hparam -> member -> (env steps, values) from the evaluation rows, for the hparams that
    differ between members or change over time."""
    series: dict[str, dict[int, tuple[list, list]]] = {}
    for row in sorted(rows, key=lambda r: (r["env_steps"], r["member"])):
        for name, value in row["hparams"].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                steps, values = series.setdefault(name, {}).setdefault(int(row["member"]), ([], []))
                steps.append(row["env_steps"])
                values.append(value)
    return {
        name: members
        for name, members in series.items()
        if len({v for _, values in members.values() for v in values if not math.isnan(v)}) > 1
    }


def plot_hparams(run_dir: Path, out_dir: Path | None = None) -> Path:
    """hparams.png: the members' evaluation returns (copies marked), one panel per varying
    hyperparameter (a line per member, exploit events marked) and the family tree of the best
    member at the last evaluation."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    if not rows:
        raise ValueError(f"{run_dir}: no evaluation rows in metrics.jsonl; nothing to plot")
    events = read_lineage(run_dir)
    trajectories = hparam_trajectories(rows)
    size = 1 + max(int(r["member"]) for r in rows)
    # Imported here: the command line imports this module, and matplotlib costs every command
    # a third of a second of start-up.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 2.6 * (len(trajectories) + 2)), dpi=110)
    FigureCanvasAgg(figure)
    panels = figure.subplots(len(trajectories) + 2, 1, sharex=True, squeeze=False)[:, 0]
    _plot_returns(panels[0], rows, copy_jumps(rows, events))
    for axes, (name, members) in zip(panels[1:], trajectories.items(), strict=False):
        for member, (steps, values) in sorted(members.items()):
            # Rows hold the hparams in force up to their evaluation: each value is drawn over
            # the interval ending at its row, so a change shows where the round decided it.
            axes.step(steps, values, where="pre", color=f"C{member % 10}", label=f"{member}")
        for event in events:
            value = event["new_hparams"].get(name)
            if isinstance(value, int | float):
                axes.plot(event["env_steps"], value, "k.", markersize=4)
        positive = all(v > 0 for _, values in members.values() for v in values)
        if positive and _spread(members) > 10:
            axes.set_yscale("log")
        axes.set_ylabel(name)
        axes.grid(True, alpha=0.3)
    panels[0].legend(title="member", fontsize="x-small", ncol=min(size, 8), loc="best")
    if trajectories:
        panels[1].set_title("hyperparameters per member (dots: set by a strategy event)")
    _plot_family_tree(panels[-1], rows, events, size)
    panels[-1].set_xlabel("environment steps (whole population)")
    figure.tight_layout()
    out_dir = Path(out_dir) if out_dir is not None else run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / HPARAMS_PLOT
    figure.savefig(path)
    return path


def _plot_returns(axes, rows: list[dict], jumps: list[Jump]) -> None:
    for member in sorted({int(r["member"]) for r in rows}):
        own = sorted((r["env_steps"], r["return_mean"]) for r in rows if r["member"] == member)
        steps, returns = zip(*own, strict=True)
        axes.plot(steps, returns, "-", color=f"C{member % 10}", lw=1, label=f"{member}")
    for jump in jumps:
        color = f"C{jump.target % 10}"
        axes.plot([jump.env_steps] * 2, [jump.target_return, jump.source_return], ":", color=color)
        axes.plot(jump.env_steps, jump.source_return, "^", color=color, markersize=4)
    axes.set_ylabel("evaluation return")
    axes.set_title("return per member (dotted, triangle: a copy of another member's state)")
    axes.grid(True, alpha=0.3)


def _spread(members: dict[int, tuple[list, list]]) -> float:
    values = [v for _, vs in members.values() for v in vs if not math.isnan(v)]
    return max(values) / min(values) if values else 1.0


def _plot_family_tree(axes, rows: list[dict], events: list[dict], size: int) -> None:
    end = max(int(r["env_steps"]) for r in rows)
    for event in events:  # every copy, faint
        axes.plot([event["env_steps"]] * 2, [event["source"], event["target"]], "-", color="0.8")
    best = summarize(rows)["best_member"]
    if best is not None:
        line = ancestry(events, best, end)
        for index, segment in enumerate(line):
            axes.plot([segment.start, segment.end], [segment.member] * 2, "-", color="C3", lw=3)
            if index:  # the copy that moved the line here
                previous = line[index - 1].member
                axes.plot([segment.start] * 2, [previous, segment.member], "-", color="C3", lw=1.5)
        axes.set_title(f"family tree of the best member ({best}); grey: every copy")
    axes.set_ylim(-0.5, size - 0.5)
    axes.set_ylabel("member")
    axes.grid(True, alpha=0.3)

"""`fastpop pbt-replay RUN_DIR [--member best|N]`: train one fresh member from scratch with the
hyperparameter schedule PBT gave member N's line, without the weights it copied.

The line is the member's ancestry (`lineage.ancestry`: whose state it held, from when), read from
the run's lineage.jsonl; it starts with the initial hparams of its first ancestor (members.json)
and changes at every copy along it to the hparams the copy left in force. The replay is an
ordinary run directory (default `<RUN_DIR>_replay_member<N>` beside RUN_DIR) of the same config
with strategy `schedule` (fastpop.strategies.schedule) and one member, for as many env steps per
member as the PBT member was evaluated at; `replay_vs_pbt.png` there draws both returns and the
scheduled hparams against env steps per member. If the replay matches the PBT member, the
schedule explains its result; if it falls short, the weights PBT copied did part of the work.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

from fastpop.analysis.lineage import Segment, ancestry, read_lineage
from fastpop.commands.evaluate import parse_member
from fastpop.run.run_files import MEMBERS_FILE, read_metrics, summarize
from fastpop.strategies import registry, schedule

COMPARISON_PLOT = "replay_vs_pbt.png"


class ReplayError(ValueError):
    """Bad input to `fastpop pbt-replay`; the message says what and what would be right."""


class Replay(NamedTuple):
    config: Any  # the replay's Config (strategy schedule)
    out: Path  # its run directory
    member: int  # the PBT member replayed
    line: list[Segment]  # its ancestry (env steps of the whole PBT population)
    source_size: int  # the PBT run's population size


def add_parser(commands) -> argparse.ArgumentParser:
    """Add `pbt-replay` to the `fastpop` subcommands (`commands`: from add_subparsers)."""
    parser = commands.add_parser(
        "pbt-replay",
        help="train a fresh member with the hparam schedule of a PBT member's line",
        description="Train one fresh member from scratch with the hyperparameter schedule of "
        "member N's ancestry in a PBT run (lineage.jsonl: the initial hparams of its first "
        "ancestor, then the hparams each copy along its line left in force, from the "
        "evaluation round that decided it), without the weights PBT copied. Writes an ordinary "
        "run directory (default RUN_DIR_replay_memberN beside the run) with strategy schedule "
        "and replay_vs_pbt.png: both returns and the scheduled hparams against env steps per "
        "member. `fastpop plot RUN_DIR REPLAY_DIR` compares them as runs.",
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the PBT run directory")
    parser.add_argument(
        "--member",
        default="best",
        metavar="best|N",
        help="member whose line is replayed; best: the highest return of the run's last "
        "evaluation round (default best)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="run directory (default RUN_DIR_replay_memberN)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out, only if it is a run fastpop wrote (as train --overwrite)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of the replay's config, e.g. seed=1 or population.size=3 (3 "
        "seeds following the schedule) (repeatable)",
    )
    return parser


# --- the schedule ---


def member_schedule(
    events: list[dict],
    initial: list[dict],
    member: int,
    end: int,
    size: int,
    eval_interval: int,
) -> tuple[dict, list[dict], list[Segment]]:
    """(hparams the line starts with, changes, the line) of `member` at `end` (env steps, whole
    population). Each change is {member_env_steps: the evaluation round (a multiple of
    `eval_interval`) whose decision moved the line, hparams: those that changed}, in order."""
    line = ancestry(events, member, end)
    start = dict(initial[line[0].member])
    in_force, changes = dict(start), []
    for previous, segment in itertools.pairwise(line):
        event = moving_event(events, previous.member, segment)
        new = {k: v for k, v in event["new_hparams"].items() if in_force.get(k) != v}
        in_force.update(new)
        if not new:
            continue
        steps = event.get("member_env_steps", int(event["env_steps"]) // size)
        steps -= steps % eval_interval  # the round's scheduled step (its snapshot may be later)
        if changes and changes[-1]["member_env_steps"] == steps:
            changes[-1]["hparams"].update(new)
        else:
            changes.append({"member_env_steps": int(steps), "hparams": new})
    return start, changes, line


def moving_event(events: list[dict], source: int, segment: Segment) -> dict:
    """The lineage event that moved the line from `source` to `segment.member` at its start
    (the last one written, as `ancestry` takes it)."""
    found = [
        e
        for e in events
        if int(e["target"]) == segment.member
        and int(e["source"]) == source
        and int(e["env_steps"]) == segment.start
    ]
    return found[0] if found else {"new_hparams": {}, "env_steps": segment.start}


# --- the replay's config ---


def choose_member(requested: str | int, rows: list[dict], size: int) -> tuple[int, str]:
    if requested != "best":
        if requested >= size:
            raise ReplayError(
                f"--member {requested}: the run's population has {size} members (0..{size - 1})"
            )
        return int(requested), ""
    best = summarize(rows)["best_member"] if rows else None
    if best is None:
        raise ReplayError(
            "--member best: the run has no finite evaluation return yet (metrics.jsonl); pass "
            f"--member N (0..{size - 1})"
        )
    return best, "the best return of the last evaluation round"


def read_run(run_dir: Path):
    """(the run's Config, its initial member hparams, metrics rows, lineage events)."""
    from fastpop.config import ConfigError, load_config

    if not run_dir.is_dir():
        raise ReplayError(f"run directory {run_dir} does not exist")
    try:
        config = load_config(run_dir / "config.yaml")
    except ConfigError as error:
        raise ReplayError(f"{run_dir} is not a readable fastpop run: {error}") from None
    if not registry.get(config.strategy).replayable:  # members with their own hparams
        replayable = ", ".join(registry.names_with(replayable=True))
        raise ReplayError(
            f"{run_dir}: strategy {config.strategy} shares parameters between members; a "
            f"member's line has no hparam schedule of its own (replayable: {replayable})"
        )
    members_file = run_dir / MEMBERS_FILE
    if not members_file.is_file():
        raise ReplayError(
            f"{members_file} does not exist: the members' initial hparams, which a run writes "
            "when it starts, are where the schedule begins"
        )
    initial = [m["hparams"] for m in json.loads(members_file.read_text())["members"]]
    if len(initial) != config.population.size:
        raise ReplayError(
            f"{members_file} lists {len(initial)} members; the run's config has "
            f"{config.population.size}"
        )
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    return config, initial, rows, read_lineage(run_dir)


def replay_config(run_dir: Path, member_text: str, overrides=(), out: Path | None = None) -> Replay:
    """The replay of `fastpop pbt-replay`; ReplayError, EvalError (--member) or ConfigError
    (naming the --set) on bad input."""
    from fastpop.config import config_from_dict, config_to_dict

    run_dir = Path(run_dir)
    requested = parse_member(member_text)
    config, initial, rows, events = read_run(run_dir)
    size = config.population.size
    member, _ = choose_member(requested, rows, size)
    end = max((int(r["env_steps"]) for r in rows), default=config.train.total_env_steps * size)
    start, changes, line = member_schedule(events, initial, member, end, size, config.eval.interval)
    data = config_to_dict(config)
    data["name"] = f"{config.name}_replay_member{member}"
    data["strategy"] = schedule.ENTRY.name  # the replay is the schedule strategy's run
    data["population"] = {**data["population"], "size": 1, "grid": {}, "priors": {}}
    data["population"].pop("seeds", None)  # follows population.size (--set it for more seeds)
    data["hparams"] = start
    data[schedule.ENTRY.name] = {"changes": changes, "wait": True}  # its section
    lanes = config.collect.envs_per_member
    data["collect"]["num_collectors"] = min(config.collect.num_collectors, lanes)
    data["train"]["total_env_steps"] = max(end // size, 1)
    data["train"]["max_wall_seconds"] = None  # a single member runs faster than the population
    replay = config_from_dict(data, f"the replay of {run_dir}/config.yaml", overrides)
    out = out if out is not None else run_dir.parent / f"{run_dir.name}_replay_member{member}"
    return Replay(replay, out, member, line, size)


def describe(replay: Replay) -> str:
    """Lines for the terminal: the member, its line and the schedule."""
    config, member, size = replay.config, replay.member, replay.source_size
    path = " -> ".join(f"{s.member} (from {s.start // size:,})" for s in replay.line)
    lines = [f"replaying member {member}'s line (member (from env steps per member)): {path}"]
    lines.append(f"  starts with {_format(config.hparams)}")
    changes = config.section(schedule.ENTRY.name).changes
    for change in changes:
        steps = change["member_env_steps"]
        lines.append(f"  after the evaluation at {steps:,} env steps: {_format(change['hparams'])}")
    if not changes:
        lines.append("  (no hparam change along the line)")
    return "\n".join(lines)


def _format(hparams: dict) -> str:
    return ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in hparams.items()
    )


# --- the comparison plot ---


def line_rows(rows: list[dict], line: list[Segment]) -> list[dict]:
    """Per evaluation round, the row of the member holding the line then (the round at a copy
    belongs to the member copied from: it was evaluated before the copy)."""
    chosen = []
    for row in sorted(rows, key=lambda r: (r["env_steps"], r["member"])):
        steps = int(row["env_steps"])
        holder = next((s for s in line if s.start < steps <= s.end), line[0])
        if int(row["member"]) == holder.member:
            chosen.append(row)
    return chosen


def plot_comparison(pbt_run: Path, replay_run: Path, member: int, line: list[Segment]) -> Path:
    """replay_vs_pbt.png in `replay_run`: the return of the PBT member's line and of the replay's
    members, and each scheduled hparam of both, against env steps per member."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    pbt_rows, replay_rows = line_rows(read_metrics(pbt_run), line), read_metrics(replay_run)
    names = sorted({n for r in pbt_rows for n, v in r["hparams"].items() if _varies(pbt_rows, n)})
    figure = Figure(figsize=(9, 3.2 * (1 + len(names))), dpi=110)
    FigureCanvasAgg(figure)
    panels = figure.subplots(1 + len(names), 1, sharex=True, squeeze=False)[:, 0]
    x = lambda rows: [r["member_env_steps"] for r in rows]
    panels[0].plot(
        x(pbt_rows),
        [r["return_mean"] for r in pbt_rows],
        "o-",
        color="C3",
        label=f"PBT member {member}'s line ({pbt_run.name})",
    )
    for index, replayed in enumerate(sorted({int(r["member"]) for r in replay_rows})):
        rows = [r for r in replay_rows if int(r["member"]) == replayed]
        label = f"replay ({replay_run.name})" if index == 0 else None
        panels[0].plot(x(rows), [r["return_mean"] for r in rows], "s--", color="C0", label=label)
    panels[0].set_ylabel("evaluation return")
    panels[0].set_title("PBT member vs a fresh member trained with its hparam schedule")
    panels[0].legend(fontsize="small", loc="best")
    for axes, name in zip(panels[1:], names, strict=True):
        # A row holds the hparams in force up to its evaluation (a change decided there shows
        # from the next row on): each value is drawn over the interval that ends at its row.
        axes.step(
            x(pbt_rows),
            [r["hparams"][name] for r in pbt_rows],
            where="pre",
            color="C3",
            label="PBT line",
        )
        rows = [r for r in replay_rows if int(r["member"]) == 0]
        axes.plot(
            x(rows),
            [r["hparams"].get(name, math.nan) for r in rows],
            "s",
            color="C0",
            markersize=4,
            label="replay",
        )
        axes.set_ylabel(name)
        axes.legend(fontsize="x-small", loc="best")
    for axes in panels:
        axes.grid(True, alpha=0.3)
    panels[-1].set_xlabel("environment steps per member (hparams: at each evaluation)")
    figure.tight_layout()
    path = Path(replay_run) / COMPARISON_PLOT
    figure.savefig(path)
    return path


def _varies(rows: list[dict], name: str) -> bool:
    values = {r["hparams"].get(name) for r in rows}
    return len(values) > 1 and all(isinstance(v, int | float) for v in values)

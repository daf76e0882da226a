"""The tables of `fastpop bench gpu --learning` (the learning programme): each run's
`runs/<name>/results.md` and the directory's README.md. Per run: its walltime-vs-return plot,
the command that made it, and the best member's return and the population's IQM at time marks;
the PBT run's returns at EvoRL-sized iterations beside EvoRL's published curve, with its
lineage's rounds and exploits and, where it ran, the same population with PBT off; the
recipe's beside FastTD3's published return and wall time. A published number appears only where
a stored source holds it, named beside it; the learning targets are judged from the recorded
runs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import NamedTuple

from fastpop.bench.gpu_phases import read_record
from fastpop.bench.gpu_plans import EVORL_ITERATION, MANIFEST
from fastpop.bench.gpu_report import environment_lines, load, phase_table

NOT_FOUND = "not found in stored sources"
# FastTD3's published Playground curves: github.com/younggyoseo/FastTD3,
# data/playground_result.json (commit 2d83b6a), its README: "a single Nvidia A100 80GB GPU for
# all experiments". (seconds, env steps as published, mean return) per point, a few of its 10.
FASTTD3_SOURCE = (
    "FastTD3's data/playground_result.json (github.com/younggyoseo/FastTD3, commit 2d83b6a), "
    "one NVIDIA A100 80GB (its README)"
)
FASTTD3_PUBLISHED = {
    "T1JoystickFlatTerrain": ((336.4, 5_120_000, 17.50), (672.8, 10_240_000, 23.36),
                              (1009.2, 15_360_000, 29.22), (3027.5, 46_080_000, 34.80)),
    "G1JoystickFlatTerrain": ((433.3, 5_120_000, 4.49), (866.7, 10_240_000, 16.74),
                              (1300.0, 15_360_000, 23.28), (3900.1, 46_080_000, 31.36)),
}  # fmt: skip
FASTTD3_TASKS_ONLY = (
    "FastTD3 publishes Playground curves for the G1 / T1 joystick tasks only "
    "(configs/td3_recipe_playground_g1_joystick.yaml trains G1JoystickFlatTerrain)"
)
# EvoRL (Zheng et al. 2025) shows its PBT-SAC returns as figures only: no curve's values were
# found in the stored sources searched (its repository github.com/EMI-Group/evorl, its paper).
EVORL_SOURCE = "EvoRL's PBT-SAC return curve (arXiv 2501.15129, github.com/EMI-Group/evorl)"


class Round(NamedTuple):
    """One evaluation round of a run: the best member and the population's IQM, with its 95%
    bootstrap interval over the members (analysis/aggregate.py)."""

    wall_seconds: float
    member_env_steps: int
    best: float
    iqm: float
    low: float
    high: float


def run_rounds(run_dir: Path) -> list[Round]:
    """The run's evaluation rounds in order (none where it has no metrics yet)."""
    import numpy as np

    from fastpop.analysis.aggregate import interval_estimates, iqm
    from fastpop.run.run_files import METRICS_FILE, evaluation_rounds, finite_returns, read_metrics

    if not (run_dir / METRICS_FILE).is_file():
        return []
    rounds = []
    for group in evaluation_rounds(read_metrics(run_dir / METRICS_FILE)):
        returns = np.asarray(finite_returns(group), np.float64)
        nan = math.nan
        point, low, high = (
            interval_estimates(returns, np.zeros(len(returns)), iqm, repetitions=1000)
            if len(returns)
            else (nan, nan, nan)
        )
        best = float(returns.max()) if len(returns) else nan
        wall, steps = max(r["wall_time"] for r in group), max(r["member_env_steps"] for r in group)
        rounds.append(Round(float(wall), int(steps), best, float(point), float(low), float(high)))
    return rounds


def shown(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def iqm_cell(round_: Round) -> str:
    return f"{shown(round_.iqm)} [{shown(round_.low)}, {shown(round_.high)}]"


def time_mark_table(rounds: list[Round], marks: list[float], ran_seconds: float) -> list[str]:
    """At each mark, the last evaluation taken by then: the best member's return and the
    population's IQM; a mark past the run's end says how long it ran instead."""
    lines = ["| wall s | member env steps | best member | population IQM [95% CI] |"]
    lines.append("|---:|---:|---:|---:|")
    for mark in marks:
        taken = [r for r in rounds if r.wall_seconds <= mark]
        if mark > ran_seconds:
            lines.append(f"| {mark:g} | ran {ran_seconds:.0f} s | - | - |")
        elif not taken:
            lines.append(f"| {mark:g} | no evaluation yet | - | - |")
        else:
            last = taken[-1]
            lines.append(
                f"| {mark:g} | {last.member_env_steps:,} | {shown(last.best)} | {iqm_cell(last)} |"
            )
    return lines


def exploits(run_dir: Path) -> list[dict]:
    """The lineage's exploit events (a member continued from another's state)."""
    from fastpop.analysis.lineage import read_lineage

    return [e for e in read_lineage(run_dir) if e.get("kind") == "exploit"]


def iteration_table(run_dir: Path, rounds: list[Round], off: list[Round] | None) -> list[str]:
    """The PBT run per evaluation, at EvoRL-sized iterations (EVORL_ITERATION's env steps per
    member): its best member, IQM, PBT rounds and exploits so far, the same population with
    PBT off at the same env steps where it ran, and EvoRL's published value."""
    events = exploits(run_dir)
    off_by_steps = {r.member_env_steps: r for r in off or []}
    head = "| EvoRL iterations | member env steps | wall s | best member | population IQM [95% CI] "
    head += "| PBT rounds / exploits so far |"
    rule = "|---:|---:|---:|---:|---:|---:|"
    if off is not None:
        head += " PBT off: best | PBT off: IQM | IQM gain of PBT |"
        rule += "---:|---:|---:|"
    lines = [head + " EvoRL PBT-SAC (published) |", rule + "---|"]
    for r in rounds:
        so_far = [e for e in events if e["member_env_steps"] <= r.member_env_steps]
        cells = [
            f"{r.member_env_steps / EVORL_ITERATION['env_steps']:.2f}",
            f"{r.member_env_steps:,}",
            f"{r.wall_seconds:.0f}",
            shown(r.best),
            iqm_cell(r),
            f"{len({e['round'] for e in so_far})} / {len(so_far)}",
        ]
        if off is not None:
            other = off_by_steps.get(r.member_env_steps)
            gain = None if other is None else r.iqm - other.iqm
            cells += [shown(other.best) if other else "-", iqm_cell(other) if other else "-"]
            cells.append(shown(gain))
        lines.append("| " + " | ".join([*cells, NOT_FOUND]) + " |")
    return lines


def fasttd3_lines(env_id: str, rounds: list[Round]) -> list[str]:
    """FastTD3's published return and wall time beside the recipe's: for the run's own task
    where published, else its published tasks as a reference, not compared."""
    task = env_id.split("/", 1)[-1]
    lines = [f"FastTD3 (published), from {FASTTD3_SOURCE}:", ""]
    if task not in FASTTD3_PUBLISHED:
        lines += [
            f"- {task}: {NOT_FOUND}. {FASTTD3_TASKS_ONLY}; its tasks, for reference "
            "only (another task, not comparable):",
            "",
        ]
    lines += [
        "| task | wall s | env steps (as published) | return (published) | this run by then |"
    ]
    lines += ["|---|---:|---:|---:|---:|"]
    for name, points in FASTTD3_PUBLISHED.items():
        for seconds, steps, value in points:
            taken = [r.best for r in rounds if r.wall_seconds <= seconds]
            mine = shown(max(taken, default=math.nan)) if name == task else "another task"
            lines.append(f"| {name} | {seconds:.0f} | {steps:,} | {value:.2f} | {mine} |")
    return lines


def recipe_target(run: dict | None, rounds: list[Round]) -> tuple[str, str]:
    """(measured, verdict): the best member reaches FastTD3's published return for the task
    within its published wall time (the latest published point inside the run's length)."""
    if not run or "error" in run or "skipped" in run:
        return "-", "not measured (no recipe run)"
    best = max((r.best for r in rounds if math.isfinite(r.best)), default=math.nan)
    measured = f"best {shown(best)} in {run['wall_seconds']:.0f} s on {run['env']}"
    points = FASTTD3_PUBLISHED.get(run["env"].split("/", 1)[-1])
    if points is None:
        return measured, f"not judged: FastTD3's return for it is {NOT_FOUND}"
    inside = [p for p in points if p[0] <= run["wall_seconds"]]
    if not inside:  # met all the same where it reached the first point's return sooner
        seconds, _, value = points[0]
        if best >= value:
            measured += f"; {shown(best)} by {run['wall_seconds']:.0f} s against {value:.2f}"
            return measured, f"**met** (before FastTD3's {seconds:.0f} s)"
        return measured, "not judged: the run is shorter than FastTD3's first published point"
    seconds, _, value = inside[-1]
    by_then = max((r.best for r in rounds if r.wall_seconds <= seconds), default=-math.inf)
    measured += f"; {shown(by_then)} by {seconds:.0f} s against {value:.2f}"
    return measured, "**met**" if by_then >= value else "**missed**"


def learning_targets(out_dir: Path, runs: dict) -> list[tuple[str, str, str]]:
    """The learning targets: (target, measured, verdict)."""
    recipe = next((r for r in runs.values() if r.get("kind") == "recipe"), None)
    recipe_rounds = (
        run_rounds(out_dir / recipe["run_dir"]) if recipe and "run_dir" in recipe else []
    )
    targets = [
        (
            "recipe: the best member reaches FastTD3's published return for its task within "
            "FastTD3's published wall time",
            *recipe_target(recipe, recipe_rounds),
        )
    ]
    pbt = next((r for r in runs.values() if r.get("kind") == "pbt"), None)
    name = "SAC PBT, brax/ant: at least 3 PBT rounds, exploits in its lineage"
    if not pbt or "run_dir" not in pbt:
        return [*targets, (name, "-", "not measured (no PBT run)")]
    events = exploits(out_dir / pbt["run_dir"])
    rounds = len({e["round"] for e in events})
    met = rounds >= 3 and pbt["population"] == 256 and pbt["env"] == "brax/ant"
    measured = f"{rounds} rounds, {len(events)} exploits ({pbt['population']} members)"
    targets.append((name, measured, "**met**" if met else "**missed**"))
    last = run_rounds(out_dir / pbt["run_dir"])[-1:]
    targets.append(
        (
            "SAC PBT: population IQM at or above EvoRL's at equal iterations",
            f"IQM {shown(last[0].iqm) if last else '-'} at its last evaluation",
            f"not judged: EvoRL's published values are {NOT_FOUND}",
        )
    )
    return targets


def run_section(out_dir: Path, name: str, run: dict, command: str, base: Path) -> list[str]:
    """One run's section: what ran, the command, its plots (paths from `base`) and tables."""
    if "skipped" in run or "error" in run:
        return [f"### {name}", "", f"Not run: {run.get('skipped') or run['error']}"]
    run_dir = out_dir / run["run_dir"]
    rounds = run_rounds(run_dir)
    lines = [
        f"### {name}",
        "",
        f"{run['kind']}: {run['algo']} on {run['env']}, {run['population']} members "
        f"({run['collect_mode']} mode), {run['wall_seconds']:.0f} s of wall time (compilation "
        f"included; planned {run['planned_wall_seconds']:.0f}), {run['member_env_steps']:,} env "
        f"steps and {run['updates_per_member']:,} updates per member; {run['stopped_by']}.",
        "",
        f"Made by `{command}`; the run alone: `{run['train_command']}`.",
        "",
        *(f"![{Path(p).name}]({(out_dir / p).relative_to(base).as_posix()})" for p in run["plots"]),
        "",
        *time_mark_table(rounds, run["time_marks"], run["wall_seconds"]),
    ]
    if run["kind"] == "pbt":
        off = next((r for r in read_runs(out_dir).values() if r.get("kind") == "pbt_off"), None)
        off_rounds = run_rounds(out_dir / off["run_dir"]) if off and "run_dir" in off else None
        events = exploits(run_dir)
        lines += [
            "",
            f"Lineage: `{run['run_dir']}/lineage.jsonl`, {len({e['round'] for e in events})} "
            f"PBT rounds and {len(events)} exploits; its plot (returns with copies marked, "
            f"hparams, the best member's family tree): `fastpop plot {run['run_dir']} --hparams`.",
            "",
            f"At equal iterations, beside {EVORL_SOURCE}:",
            "",
            *iteration_table(run_dir, rounds, off_rounds),
        ]
    if run["kind"] == "recipe":
        lines += ["", *fasttd3_lines(run["env"], rounds)]
    return lines


def read_runs(out_dir: Path) -> dict:
    return (read_record(out_dir, "learning") or {}).get("runs") or {}


def write_run_results(out_dir: Path, name: str, run: dict, record: dict) -> Path:
    """runs/<name>/results.md: the run's section, beside its plots."""
    run_dir = out_dir / run["run_dir"]
    lines = run_section(out_dir, name, run, record.get("command", ""), base=run_dir)
    path = run_dir / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_learning_readme(out_dir: Path, manifest: dict | None = None) -> Path:
    """README.md of a learning directory: the machine, the phase, the learning targets and each
    run's section (rewritten after each run and after the phase)."""
    manifest = manifest or load(out_dir, MANIFEST) or {"phases": {}}
    record = read_record(out_dir, "learning") or {}
    runs = record.get("runs") or {}
    lines = ["# fastpop bench gpu: the learning programme", ""]
    if manifest.get("smoke"):
        lines += ["**Smoke sizes** (`--smoke`): tiny populations and envs; no target judged.", ""]
    lines += [f"Last command: `{manifest.get('command', '')}`", "", "## Machine", ""]
    lines += environment_lines({"learning": record})
    lines += ["", "## Phases", "", *phase_table(manifest), ""]
    lines += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    for name, measured, verdict in learning_targets(out_dir, runs):
        verdict = "not judged (smoke sizes)" if manifest.get("smoke") else verdict
        lines.append(f"| {name} | {measured} | {verdict} |")
    lines += ["", "## Runs", ""]
    for name, run in runs.items():
        lines += [*run_section(out_dir, name, run, record.get("command", ""), out_dir), ""]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path

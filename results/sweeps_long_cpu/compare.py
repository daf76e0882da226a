"""The table and figure of results/sweeps_long_cpu/ from the runs `run.sh` writes.

    python results/sweeps_long_cpu/compare.py RUNS_DIR --out results/sweeps_long_cpu

RUNS_DIR holds <arm>_seed<k>/: fastpop run directories (independent, pbt, pb2, mfpbt) and
ray_sweep.py outputs (ray_pb2). At each wall-clock point every member slot (a Ray trial) scores
its latest evaluation return so far; per arm the IQM over all slots of all seeds with a 95%
stratified bootstrap interval (strata: the seeds; fastpop.analysis.aggregate, 2,000 resamples),
shown once every slot of every seed has a score. Also per arm: env steps trained per second of
the whole sweep, ready intervals per member, and the time each fastpop arm first reached Ray
PB2's final IQM. Writes comparison.json and walltime_vs_iqm.png.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fastpop.analysis.aggregate import interval_estimates, iqm

ARMS = {
    "independent": "random search",
    "pbt": "PBT",
    "pb2": "PB2",
    "mfpbt": "MF-PBT",
    "ray_pb2": "Ray Tune PB2",
}
SECONDS = tuple(range(30, 241, 15))
READY_INTERVAL = 2_000  # env steps per member (td3_gymnax_pendulum_long.yaml, ray_tasks.py)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fastpop_run(run: Path) -> dict:
    """(slot, seconds since start, return) per evaluation, the sweep's env steps and seconds."""
    rows = [row for row in read_jsonl(run / "metrics.jsonl") if "return_mean" in row]
    summary = json.loads((run / "summary.json").read_text())
    slots = sorted({row["member"] for row in rows})
    return {
        "results": [(row["member"], row["wall_time"], row["return_mean"]) for row in rows],
        "slots": len(slots),
        "env_steps": summary["member_env_steps"] * len(slots),
        "seconds": summary["wall_time"],
        "ready_intervals": summary["member_env_steps"] / READY_INTERVAL,
    }


def ray_run(out: Path) -> dict:
    rows = read_jsonl(out / "rows.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    trials = sorted({row["trial"] for row in rows})
    steps = max(row["env_steps"] for row in rows)  # the furthest trial's
    return {
        "results": [(row["trial"], row["wall_seconds"], row["return"]) for row in rows],
        "slots": len(trials),
        "env_steps": summary["total_env_steps"],
        "seconds": summary["wall_seconds"],
        "ready_intervals": steps / READY_INTERVAL,
    }


def latest_scores(run: dict, seconds: float) -> list[float] | None:
    """Each slot's latest return by `seconds`; None while a slot has none yet."""
    latest: dict = {}
    for slot, at, value in sorted(run["results"], key=lambda result: result[1]):
        if at <= seconds:
            latest[slot] = value
    return list(latest.values()) if len(latest) == run["slots"] else None


def arm_points(runs: list[dict]) -> list[dict]:
    points = []
    for seconds in SECONDS:
        per_run = [latest_scores(run, seconds) for run in runs]
        if any(scores is None for scores in per_run):
            points.append({"seconds": seconds})
            continue
        scores = np.array([s for run in per_run for s in run], np.float64)
        strata = np.repeat(np.arange(len(per_run)), [len(run) for run in per_run])
        estimate = interval_estimates(scores, strata, iqm)
        points.append({"seconds": seconds, "iqm": float(estimate.point),
                       "low": float(estimate.low), "high": float(estimate.high)})  # fmt: skip
    return points


def finished(path: Path, arm: str) -> bool:
    """A finished run of `arm` (one still running has no summary.json yet)."""
    return (
        re.fullmatch(rf"{arm}_seed\d+", path.name) is not None and (path / "summary.json").exists()
    )


def first_reaching(points: list[dict], level: float) -> int | None:
    return next((p["seconds"] for p in points if p.get("iqm", -np.inf) >= level), None)


def plot(report: dict, path: Path) -> None:
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, entry in report.items():
        points = [p for p in entry["points"] if "iqm" in p]
        x = [p["seconds"] for p in points]
        axes.plot(
            x, [p["iqm"] for p in points], marker="o", label=f"{label} ({entry['seeds']} seeds)"
        )
        axes.fill_between(x, [p["low"] for p in points], [p["high"] for p in points], alpha=0.2)
    axes.set_xlabel("wall-clock seconds")
    axes.set_ylabel("IQM of the member slots' latest return (95% CI)")
    axes.set_title("TD3 on Pendulum-v1, 16 members, wide priors, 2 CPU cores")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {}
    for arm, label in ARMS.items():
        dirs = sorted(p for p in args.runs.iterdir() if finished(p, arm))
        if not dirs:
            continue
        runs = [(ray_run if arm.startswith("ray") else fastpop_run)(d) for d in dirs]
        report[label] = {
            "seeds": len(runs),
            "env_steps_per_second": float(np.mean([r["env_steps"] / r["seconds"] for r in runs])),
            "ready_intervals_per_member": [round(r["ready_intervals"], 1) for r in runs],
            "points": arm_points(runs),
        }
    ray = report.get("Ray Tune PB2")
    ray_final = (
        next((p["iqm"] for p in reversed(ray["points"]) if "iqm" in p), None) if ray else None
    )
    for entry in report.values():
        entry["first_at_ray_final_iqm"] = None if ray_final is None else first_reaching(
            entry["points"], ray_final)  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out / "walltime_vs_iqm.png")
    for label, entry in report.items():
        cells = "  ".join(
            f"{p['seconds']}:{p.get('iqm', float('nan')):5.0f}" for p in entry["points"]
        )
        print(f"{label:14s} {entry['env_steps_per_second']:6.0f} steps/s  {cells}")


if __name__ == "__main__":
    main()

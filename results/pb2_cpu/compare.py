"""The figure and table of results/pb2_cpu/ from the runs `run.sh` writes.

    python results/pb2_cpu/compare.py RUNS_DIR --out results/pb2_cpu

RUNS_DIR holds <strategy>_seed<k>/ run directories. At each wall-clock point every member slot
scores its latest evaluation return so far (a halving slot: its current trial's); per strategy
the IQM over all slots of all seeds, with a 95% stratified bootstrap interval (strata: the seeds,
fastpop.analysis.aggregate), and the mean over seeds of each run's best slot. Writes
comparison.json and walltime_vs_iqm.png.
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
from fastpop.analysis.sweep import load_member_curves

STRATEGIES = {"independent": "random search", "pbt": "PBT", "pb2": "PB2", "halving": "halving"}
SECONDS = (30, 45, 60, 75, 90, 105, 120)


def latest(curve, seconds: float) -> float:
    minutes, returns = curve.finite("wall_minutes")
    taken = np.searchsorted(minutes, seconds / 60, side="right") - 1
    return float(returns[taken]) if taken >= 0 else np.nan


def arm_table(runs: list[Path]) -> list[dict]:
    curves = [load_member_curves(run) for run in runs]  # one list of slots per seed
    table = []
    for seconds in SECONDS:
        per_run = [[latest(c, seconds) for c in slots] for slots in curves]
        scores = np.array([s for run in per_run for s in run])
        strata = np.repeat(np.arange(len(per_run)), [len(run) for run in per_run])
        if np.isnan(scores).any():  # a slot not evaluated yet: no statistic at this point
            table.append({"seconds": seconds})
            continue
        estimate = interval_estimates(scores, strata, iqm)
        best = float(np.mean([max(run) for run in per_run]))
        table.append({"seconds": seconds, "iqm": float(estimate.point),
                      "low": float(estimate.low), "high": float(estimate.high),
                      "best_slot_mean": best})  # fmt: skip
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = {}
    for strategy, label in STRATEGIES.items():
        runs = sorted(p for p in args.runs.iterdir()
                      if p.is_dir() and re.fullmatch(rf"{strategy}_seed\d+", p.name))  # fmt: skip
        if runs:
            report[label] = {"seeds": len(runs), "points": arm_table(runs)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(report, indent=1) + "\n")
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, entry in report.items():
        points = [p for p in entry["points"] if "iqm" in p]
        x = [p["seconds"] for p in points]
        name = f"{label} ({entry['seeds']} seeds)"
        axes.plot(x, [p["iqm"] for p in points], marker="o", label=name)
        axes.fill_between(x, [p["low"] for p in points], [p["high"] for p in points], alpha=0.2)
    axes.set_xlabel("wall-clock seconds (start-up and compilation included)")
    axes.set_ylabel("IQM of the member slots' latest return (95% CI)")
    axes.set_title("TD3 on gymnax Pendulum-v1, 8 members, 2 CPU cores")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.savefig(args.out / "walltime_vs_iqm.png")
    for label, entry in report.items():
        points = entry["points"]
        cells = "  ".join(f"{p['seconds']}s:{p.get('iqm', float('nan')):6.0f}" for p in points)
        print(f"{label:14s} {cells}")


if __name__ == "__main__":
    main()

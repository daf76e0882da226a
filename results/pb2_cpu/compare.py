"""The figure and table of results/pb2_cpu/ from the runs `run.sh` writes.

    python results/pb2_cpu/compare.py RUNS_DIR --out results/pb2_cpu [--name NAME]

RUNS_DIR holds <arm>_seed<k>/ run directories (run.sh's arms). At each wall-clock point every
member slot scores its latest evaluation return so far (a halving slot: its current trial's); per
arm the IQM over all slots of all seeds, with a 95% stratified bootstrap interval (strata: the
seeds, fastpop.analysis.aggregate), and the mean over seeds of each run's best slot; and how
late the strategy acted on its results (`evaluator_lag`: from each lineage row, the evaluation
intervals and seconds between the snapshot and the round that acted on it). Writes
comparison.json and walltime_vs_iqm.png, or NAME.json and NAME.png.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fastpop import config as config_lib
from fastpop.analysis.aggregate import interval_estimates, iqm
from fastpop.analysis.sweep import load_member_curves

STRATEGIES = {
    "independent": "random search",
    "pbt": "PBT",
    "pb2": "PB2",
    "halving": "halving",
    "pbt_lagging": "PBT, evaluator lagging",
    "pb2_lagging": "PB2, evaluator lagging",
}
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


def evaluator_lag(runs: list[Path]) -> dict | None:
    """Median and largest delay, over every lineage row of the runs, between the snapshot a
    round's result came from and the round: in evaluation intervals and in seconds."""
    intervals, seconds = [], []
    for run in runs:
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        snapshots = {r["eval_index"]: r for r in rows if "eval_index" in r}
        lineage = run / "lineage.jsonl"
        config = config_lib.load_config(run / "config.yaml")
        size, interval = config.population.size, config.eval.interval
        for line in lineage.read_text().splitlines() if lineage.exists() else ():
            event = json.loads(line)
            taken = snapshots.get(event["eval_index"])
            if taken is not None:
                steps = event["env_steps"] // size - taken["member_env_steps"]
                intervals.append(steps / interval)
                seconds.append(event["wall_time"] - taken["wall_time"])
    if not intervals:
        return None
    return {"median_intervals": float(np.median(intervals)), "max_intervals": max(intervals),
            "median_seconds": float(np.median(seconds)), "rounds": len(intervals)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default=None, help="NAME.json and NAME.png (default: "
                        "comparison.json and walltime_vs_iqm.png)")  # fmt: skip
    args = parser.parse_args()
    report = {}
    for strategy, label in STRATEGIES.items():
        runs = sorted(p for p in args.runs.iterdir()
                      if p.is_dir() and re.fullmatch(rf"{strategy}_seed\d+", p.name))  # fmt: skip
        if runs:
            lag = evaluator_lag(runs)
            report[label] = {"seeds": len(runs), "points": arm_table(runs), "evaluator_lag": lag}
    args.out.mkdir(parents=True, exist_ok=True)
    table, figure_name = (f"{args.name}.json", f"{args.name}.png") if args.name else (
        "comparison.json", "walltime_vs_iqm.png")  # fmt: skip
    (args.out / table).write_text(json.dumps(report, indent=1) + "\n")
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
    axes.set_title("TD3 on Pendulum-v1, 8 members, 2 CPU cores")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.savefig(args.out / figure_name)
    for label, entry in report.items():
        points = entry["points"]
        cells = "  ".join(f"{p['seconds']}s:{p.get('iqm', float('nan')):6.0f}" for p in points)
        print(f"{label:24s} {cells}  lag {entry['evaluator_lag']}")


if __name__ == "__main__":
    main()

"""The table and figure of results/vs_ray_tune/ from the four arms `run.sh` writes.

    python results/vs_ray_tune/compare.py RUNS_DIR --out results/vs_ray_tune

RUNS_DIR holds fastpop_pbt/, fastpop_pb2/ (fastpop run directories) and ray_pbt/, ray_pb2/
(ray_sweep.py outputs). At each minute every trial (a fastpop member, a Ray trial) scores its
latest evaluation return so far; the IQM over the 8 with a 95% bootstrap interval
(fastpop.analysis.aggregate, 2,000 resamples), the env steps trained so far over all trials, and
how many trials were training at once. Writes comparison.json and walltime_vs_iqm.png.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fastpop.analysis.aggregate import interval_estimates, iqm

ARMS = ("fastpop_pbt", "fastpop_pb2", "ray_pbt", "ray_pb2")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fastpop_arm(run_dir: Path) -> dict:
    """(trial, seconds, env steps of the whole population so far, return) per evaluation."""
    rows = read_jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    size = len({row["member"] for row in rows})
    return {
        "results": [(r["member"], r["wall_time"], r["env_steps"], r["return_mean"]) for r in rows],
        "seconds": summary["wall_time"],
        "env_steps": summary["member_env_steps"] * size,
        "running": float(size),  # every member steps and updates in every chunk
        "trials": size,
    }


def ray_arm(out_dir: Path) -> dict:
    rows = read_jsonl(out_dir / "rows.jsonl")
    summary = json.loads((out_dir / "summary.json").read_text())
    running = [r.get("running", 0) for r in read_jsonl(out_dir / "running.jsonl")]
    trained, results = 0, []  # env steps trained by every trial so far
    for row in sorted(rows, key=lambda r: r["wall_seconds"]):
        trained += row["trained_env_steps"]
        results.append((row["trial"], row["wall_seconds"], trained, row["return"]))
    return {
        "results": results,
        "seconds": summary["wall_seconds"],
        "env_steps": summary["total_env_steps"],
        "running": float(np.mean(running)) if running else math.nan,
        "trials": len({row["trial"] for row in rows}),
    }


def scores_at(results: list[tuple], seconds: float) -> np.ndarray:
    """Each trial's latest return by `seconds` (trials without one yet: none)."""
    latest: dict = {}
    for trial, at, _, value in sorted(results, key=lambda r: r[1]):
        if at <= seconds:
            latest[trial] = value
    return np.array(list(latest.values()), np.float64)


def steps_at(results: list[tuple], seconds: float) -> int:
    done = [steps for _, at, steps, _ in results if at <= seconds]
    return max(done, default=0)


def minute_table(arm: dict, minutes: range) -> list[dict]:
    table = []
    for minute in minutes:
        scores = scores_at(arm["results"], 60.0 * minute)
        entry = {"minute": minute, "trials_scored": len(scores),
                 "env_steps": steps_at(arm["results"], 60.0 * minute)}  # fmt: skip
        if len(scores):
            estimate = interval_estimates(scores, np.zeros(len(scores)), iqm)
            entry |= {"iqm": float(estimate.point), "low": float(estimate.low),
                      "high": float(estimate.high)}  # fmt: skip
        table.append(entry)
    return table


def plot(tables: dict[str, list[dict]], path: Path) -> None:
    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, table in tables.items():
        scored = [row for row in table if "iqm" in row]
        minutes = [row["minute"] for row in scored]
        axes.plot(minutes, [row["iqm"] for row in scored], marker="o", label=name)
        axes.fill_between(minutes, [row["low"] for row in scored],
                          [row["high"] for row in scored], alpha=0.2)  # fmt: skip
    axes.set_xlabel("wall-clock minutes")
    axes.set_ylabel("IQM of the 8 trials' latest return (95% CI)")
    axes.set_title("TD3 PBT / PB2 sweeps on InvertedDoublePendulum-v5, 2 CPU cores, 1 seed")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    arms = {name: (fastpop_arm if name.startswith("fastpop") else ray_arm)(args.runs / name)
            for name in ARMS if (args.runs / name).exists()}  # fmt: skip
    minutes = range(1, 11)
    tables = {name: minute_table(arm, minutes) for name, arm in arms.items()}
    report = {
        name: {
            "env_steps_per_second": arm["env_steps"] / arm["seconds"],
            "env_steps": arm["env_steps"],
            "seconds": arm["seconds"],
            "trials_running_on_average": arm["running"],
            "trials": arm["trials"],
            "minutes": tables[name],
        }
        for name, arm in arms.items()
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "comparison.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(tables, args.out / "walltime_vs_iqm.png")
    for name, entry in report.items():
        cells = "  ".join(
            f"{row['minute']}:{row.get('iqm', math.nan):7.0f}" for row in entry["minutes"]
        )
        print(f"{name:12s} {entry['env_steps_per_second']:7.0f} steps/s  "
              f"running {entry['trials_running_on_average']:.1f}  {cells}")  # fmt: skip


if __name__ == "__main__":
    main()

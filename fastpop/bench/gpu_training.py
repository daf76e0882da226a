"""The pbt phase's training runs: a preset trained for a fixed wall time, as `fastpop train`
would (its run directory, summary.json and walltime-vs-return plot), and its throughput."""

from __future__ import annotations

import shutil
from pathlib import Path


def train_preset(config_path: Path, overrides: list[str], wall_seconds: float, run_dir: Path):
    """Train `config_path` with `overrides` for `wall_seconds` into `run_dir` (replaced: it lies
    in a `fastpop bench gpu` directory); what the report needs of the run."""
    from fastpop import config as config_lib
    from fastpop.analysis.plot import plot_runs
    from fastpop.run.loop import Run
    from fastpop.run.metrics import write_summary
    from fastpop.run.parts import build_run
    from fastpop.run.resume import is_run_directory

    config = config_lib.load_config(
        config_path, [*overrides, f"train.max_wall_seconds={wall_seconds:g}"]
    )
    if run_dir.exists():  # an earlier `bench gpu` run's: replaced, anything else kept
        if any(run_dir.iterdir()) and not is_run_directory(run_dir):
            raise ValueError(f"{run_dir} is not a fastpop run; nothing was deleted")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    summary = Run(build_run(config), run_dir).run()
    write_summary(run_dir, summary)
    record = {
        "config": str(config_path.name),
        "overrides": overrides,
        "env": config.env.id,
        "algo": config.algo,
        "population": config.population.size,
        "collect_mode": summary["collect_mode"],
        "run_dir": str(run_dir.relative_to(run_dir.parents[1])),
        "wall_seconds": summary["wall_time"],
        "learning_started_at": summary["learning_started_at"],
        "member_env_steps": summary["member_env_steps"],
        "updates_per_member": summary["updates_per_member"],
        "stopped_by": summary["stopped_by"],
    } | learning_rates(run_dir, summary)
    try:
        record["plots"] = [str(p.relative_to(run_dir.parents[1])) for p in plot_runs([run_dir])]
    except ValueError as error:  # no evaluation finished in the wall time
        record["plots"], record["no_plot"] = [], str(error)
    return record


def learning_rates(run_dir: Path, summary: dict) -> dict:
    """Updates and env steps per member per second while learning: between the first and the
    last evaluation rows that follow the first update (the loop's own pace, without start-up,
    the final evaluation or the stop checkpoint), else over the whole time since the first
    update (an underestimate). The `..._without_evaluations` rates take out of that window the
    seconds the learner spent evaluating in it (rows' `learner_evaluation_seconds`: device mode
    evaluates in the loop, training paused); None where the rows lack them."""
    from fastpop.run.run_files import read_metrics

    rates = dict.fromkeys(["updates_per_member_per_s", "member_env_steps_per_s"])
    rates |= dict.fromkeys([f"{name}_without_evaluations" for name in rates])
    start = summary["learning_started_at"]
    if start is None:
        return rates
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    fields = ("wall_time", "updates", "member_env_steps")
    times = {(*(r[f] for f in fields), r.get("learner_evaluation_seconds")) for r in rows}
    times = sorted(times, key=lambda t: t[:3])
    times = [t for t in times if t[0] > start and t[1] > 0]
    if len(times) >= 2 and times[-1][0] > times[0][0]:
        (t0, u0, s0, e0), (t1, u1, s1, e1) = times[0], times[-1]
        how = "between evaluation rows"
    else:
        (t0, u0, s0, e0) = (start, 0, 0, None)
        (t1, u1, s1, e1) = (summary["wall_time"], summary["updates_per_member"], 0, None)
        how = "since the first update, final evaluation included"
    rates["rates_measured"] = how
    windows = {"": t1 - t0}
    if e0 is not None and e1 is not None:
        windows["_without_evaluations"] = t1 - t0 - (e1 - e0)
        rates["evaluation_seconds_in_window"] = e1 - e0
    for suffix, seconds in windows.items():
        rates[f"updates_per_member_per_s{suffix}"] = (u1 - u0) / seconds
        rates[f"member_env_steps_per_s{suffix}"] = (s1 - s0) / seconds if s1 else None
    return rates

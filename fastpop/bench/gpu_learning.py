"""The learning phase of `fastpop bench gpu --learning` (the learning programme): training
runs of a fixed wall time, in the plan's order (bench/gpu_plans.py's LEARNING_PLANS), each into
`runs/<name>/` as `fastpop train` would write it (a PBT run's lineage.jsonl among its files),
with its walltime-vs-return plot and its tables (bench/gpu_learning_report.py) in
`runs/<name>/results.md` beside the command that made them. After each run the directory's
README.md is rewritten and `after_run` is called: the runner packs the directory there, so a
remote command cut short keeps every run that finished. (The lineage plot of 256 members,
`fastpop plot --hparams`, takes seconds of the lease and is drawn from the files afterwards.)
"""

from __future__ import annotations

import gc
import shlex
import traceback
from pathlib import Path

from fastpop.bench.gpu_phases import PhaseRecord
from fastpop.bench.gpu_plans import CONFIGS_DIR, RUN_OVERRIDES

SKIPPED = "too little of the phase's time cap was left"


def learning_phase(out_dir: Path, plan: dict, record: PhaseRecord, after_run=None) -> None:
    """Each run of the plan in turn for its wall time (less where the cap leaves less; skipped
    below its minimum). A run that fails is recorded and the next one still runs; the phase
    then fails naming it."""
    from fastpop.bench.gpu_learning_report import write_learning_readme, write_run_results

    record["runs"], failed = {}, []
    for run in plan["runs"]:
        wall = min(run["wall_seconds"], record.time_left() - plan["reserve_seconds"])
        if wall < run["min_wall_seconds"]:
            left = max(wall, 0.0)
            why = f"{SKIPPED} ({left:.0f} s of the {run['min_wall_seconds']:g} s it needs)"
            record["runs"][run["name"]] = {"kind": run["kind"], "skipped": why}
            if not run.get("optional"):
                record["cut_short"] = True
            record.save()
            continue
        record.log(f"learning: {run['name']} ({run['kind']}) for {wall:.0f} s")
        trained = train_run(out_dir, run, wall)
        record["runs"][run["name"]] = trained
        if "error" in trained:
            failed.append(run["name"])
        else:
            results = write_run_results(out_dir, run["name"], trained, record)
            trained["results"] = results.relative_to(out_dir).as_posix()
            record.add_files(*(out_dir / path for path in [*trained["plots"], trained["results"]]))
        record.save()
        write_learning_readme(out_dir)
        if after_run is not None:
            after_run()
            record.log(f"learning: {run['name']} written and packed")
    if failed:
        raise RuntimeError(f"run(s) failed: {', '.join(failed)} (their errors are in `runs`)")


def train_command(run: dict, wall: float) -> str:
    """The `fastpop train` command that makes the same run alone."""
    words = ["fastpop", "train", f"configs/{run['preset']}.yaml"]
    for override in [*RUN_OVERRIDES, *run["overrides"], f"train.max_wall_seconds={wall:g}"]:
        words += ["--set", override]
    return shlex.join(words)


def train_run(out_dir: Path, run: dict, wall: float) -> dict:
    """One run trained into runs/<name>/ (gpu_training.train_preset); its record, or its error
    and traceback."""
    from fastpop.bench.gpu_training import train_preset

    run_dir = out_dir / "runs" / run["name"]
    entry = {"kind": run["kind"], "preset": run["preset"], "planned_wall_seconds": wall}
    entry |= {"train_command": train_command(run, wall), "time_marks": list(run["time_marks"])}
    try:
        config = CONFIGS_DIR / f"{run['preset']}.yaml"
        entry |= train_preset(config, [*RUN_OVERRIDES, *run["overrides"]], wall, run_dir)
    except Exception as error:  # recorded; the next run still runs
        entry |= {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
        print(f"bench gpu: run {run['name']} failed: {entry['error']}", flush=True)
    gc.collect()  # the run's device arrays go before the next run allocates its own
    return entry

"""README.md of a `fastpop bench gpu` directory: the machine, each phase's status and files,
the GPU targets judged met or missed, and the main numbers of each phase."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fastpop.bench.gpu_phases import read_record
from fastpop.bench.gpu_plans import EVORL_ITERATION, PHASES, TARGET_ALGOS, TIGHT_DEFAULT

EVORL_SECONDS = 25.0  # EvoRL's PBT-SAC iteration at 256 members on one RTX 3090
FLOOR_TARGET = 3.0  # the GPU target: the vectorized step within 3x of its floor


def nvidia_smi() -> str:
    """The driver's view of the GPUs (model, driver, memory), or why there is none."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        result = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"none ({type(error).__name__}: nvidia-smi did not answer)"
    return "; ".join(line.strip() for line in result.stdout.splitlines() if line.strip())


def load(out_dir: Path, name: str | None) -> dict | None:
    try:
        return json.loads((out_dir / name).read_text()) if name else None
    except (OSError, ValueError):
        return None


def verdict(value: float | None, threshold: float, at_most: bool = False, why: str = "") -> str:
    if value is None:
        return f"not measured{f' ({why})' if why else ''}"
    met = value <= threshold if at_most else value >= threshold
    return "**met**" if met else "**missed**"


def update_targets(out_dir: Path, record: dict | None) -> list[tuple[str, str, str]]:
    """The update's GPU targets: TD3 and SAC at P = 80 and 256, the vectorized step within 3x
    of its floor (bench/floors.py, the one definition); at P = 80 the vectorized update >= 10x
    the best sequential JAX row and >= 2x the fastest PyTorch row (the LeanRL-class ones
    included)."""
    rows = []
    for algo in TARGET_ALGOS:
        found = update_rows(out_dir, ((record or {}).get("algos") or {}).get(algo, {}))
        by_key = {}  # each row's first measurement: a lever's sweep later times its own
        for r in found:
            by_key.setdefault((r["impl"], r["population"]), r)
        for size in (80, 256):
            row = by_key.get(("vectorized", size)) or {}
            value = row.get("times_floor")
            shown = "-" if value is None else f"{value:.2f}x ({row.get('floor_bound', '?')})"
            name = f"{algo.upper()} P={size}: vectorized step / its floor <= {FLOOR_TARGET:g}x"
            why = f"no {algo} floor at P={size}"
            rows.append((name, shown, verdict(value, FLOOR_TARGET, True, why)))
        at_80 = by_key.get(("vectorized", 80)) or {}
        for field, what, threshold in (
            ("speedup_over_best_sequential", "the best sequential JAX row", 10),
            ("speedup_over_best_torch", "the fastest PyTorch row", 2),
        ):
            value = at_80.get(field)
            shown = "-" if value is None else f"{value:.1f}x"
            name = f"{algo.upper()} P=80: vectorized / {what} >= {threshold}x"
            rows.append((name, shown, verdict(value, threshold, why=f"no {algo} rows at P=80")))
    return rows


def update_rows(out_dir: Path, entry: dict) -> list[dict]:
    """An algorithm's update rows: its JSON's, else those it had when its phase stopped."""
    result = load(out_dir, entry.get("json"))
    return result["rows"] if result is not None else entry.get("rows_so_far", [])


def pbt_target(record: dict | None) -> tuple[str, str, str]:
    """Device-mode SAC PBT, 256 members on brax/ant: an EvoRL-sized iteration in <= 5 s."""
    name = "SAC PBT, 256 members, brax/ant: seconds per EvoRL iteration, evaluation pauses "
    name += "included, <= 5"
    name += f" (EvoRL: {EVORL_SECONDS:g} on an RTX 3090)"
    run = ((record or {}).get("runs") or {}).get("sac_pbt_brax_ant") or {}
    if run.get("population") != 256 or run.get("env") != "brax/ant":
        return name, "-", verdict(None, 5, why="no run at 256 members on brax/ant")
    rate = run.get("updates_per_member_per_s")
    if not rate:
        return name, "-", verdict(None, 5, why="no update ran")
    seconds = EVORL_ITERATION["updates"] / rate
    shown = f"{seconds:.2f} s ({rate:.0f} updates/member/s)"
    if training := run.get("updates_per_member_per_s_without_evaluations"):
        without = EVORL_ITERATION["updates"] / training
        shown += f"; without evaluation pauses {without:.2f} s (not judged)"
    return name, shown, verdict(seconds, 5, True)


LEARNER_BUSY_TARGET = 0.90  # the GPU target: of the learning window (bench/pipeline.py)
LEARNER_RATE_TARGET = 0.85  # of the update benchmark's row at the run's K, batch and replay


def pipeline_target(out_dir: Path, record: dict | None) -> tuple[str, str, str]:
    """The learner's GPU target: process mode, TD3 at P=80 with 14 collectors, the learner
    busy >= 90% of its learning window and its rate >= 85% of the like-for-like benchmark row,
    or the run shown bound by its rows (`fastpop.bench.pipeline.utilisation_from_summary`)."""
    name = (
        f"process mode, TD3 P=80, 14 collectors: learner busy >= {LEARNER_BUSY_TARGET:.0%} of "
        f"its learning window and its rate >= {LEARNER_RATE_TARGET:.0%} of the like-for-like "
        "benchmark row, or bound by its rows"
    )
    result = load(out_dir, (record or {}).get("json"))
    learner = (result or {}).get("learner") or {}
    if result is None or result["population"] != 80 or learner.get("collectors") != 14:
        return name, "-", verdict(None, 0, why="no run at P=80 with 14 collectors")
    if "busy_fraction_of_window" not in learner:
        return name, "-", verdict(None, 0, why="a result without the learning window's fields")
    from fastpop.bench.pipeline import bound_by

    busy, ratio = learner["busy_fraction_of_window"], learner["rate_vs_benchmark"]
    bound = bound_by(learner["waiting_for_rows_fraction"], ratio)  # today's rule on its figures
    bench = learner["benchmark"]
    shown = (
        f"busy {busy:.0%}; rate {ratio:.2f}x the row at K={bench['updates_per_call']}, batch "
        f"{bench['batch_size']}, {bench['replay_rows']:,} rows; waiting for rows "
        f"{learner['waiting_for_rows_fraction']:.0%}: bound by its {bound}"
    )
    met = (busy >= LEARNER_BUSY_TARGET and ratio >= LEARNER_RATE_TARGET) or bound == "rows"
    return name, shown, "**met**" if met else "**missed**"


def judge_targets(out_dir: Path, records: dict) -> list[tuple[str, str, str]]:
    """(target, what was measured, met / missed / not measured) for each GPU target."""
    targets = update_targets(out_dir, records.get("update"))
    targets.append(pbt_target(records.get("pbt")))
    return [*targets, pipeline_target(out_dir, records.get("pipeline"))]


def environment_lines(records: dict) -> list[str]:
    seen = next((r["environment"] for r in records.values() if r and "environment" in r), None)
    lines = [f"- GPU (nvidia-smi: model, driver, memory): {nvidia_smi()}"]
    if seen is None:
        return [*lines, "- JAX's device: not read (no phase started)"]
    lines += [
        f"- JAX's device: {seen['device_kind']} ({seen['platform']}, {seen['device_count']} "
        f"device(s)); platform version (CUDA's on a GPU): {seen['platform_version']!r}",
        f"- jax {seen['jax']}, jaxlib {seen['jaxlib']}",
        "",
        "```",
        seen["environment_info"].strip(),
        "```",
    ]
    return lines


def update_lines(out_dir: Path, record: dict) -> list[str]:
    matmul = record.get("matmul_gflops_per_s") or {}
    lines = ["### update"]
    if matmul:
        lines.append(
            f"Matmul measured in the phase: {matmul['float32']:,.0f} GFLOP/s at float32 "
            f"(precision highest), {matmul[TIGHT_DEFAULT]:,.0f} at JAX's default (TF32 where "
            "the GPU has it)."
        )
    for algo, files in (record.get("algos") or {}).items():
        rows = update_rows(out_dir, files)
        if not rows:
            lines.append(f"- {algo}: {files.get('skipped', 'no result')}")
            continue
        where = f"`{files['json']}`, `{files['png']}`" if "json" in files else "when it stopped"
        lines += ["", f"{algo.upper()} ({where}):", ""]
        lines += [
            "| impl | P | agent-updates/s | x sequential | x best sequential | x best PyTorch "
            "| x floor | GFLOP/s | compile s |"
        ]
        lines += ["|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        shown = lambda value, unit="": "-" if value is None else f"{value:.{2 if unit else 1}f}"
        for r in rows:
            ratios = " | ".join(
                shown(r.get(field))
                for field in (
                    "speedup_over_sequential",
                    "speedup_over_best_sequential",
                    "speedup_over_best_torch",
                )
            )
            lines.append(
                f"| {r['impl']} | {r['population']} | {r['agent_updates_per_s']:,.0f} | "
                f"{ratios} | {shown(r.get('times_floor'), 'x')} | {r['gflops_per_s']:,.1f} | "
                f"{r['compile_seconds']:.1f} |"
            )
        lines += anatomy_lines(rows)
    return lines


def anatomy_lines(rows: list[dict]) -> list[str]:
    """What bounds the vectorized update (fastpop.bench.anatomy), where it was read."""
    read = [r for r in rows if "kernels_per_update_step" in r]
    failed = [
        f"- P={r['population']}: not read ({r['anatomy_error']})"
        for r in rows
        if "anatomy_error" in r
    ]
    if not read:
        return ["", *failed] if failed else []
    ms = lambda r, key: "-" if key not in r else f"{1e3 * r[key]:.3f}"
    lines = ["", "What bounds a vectorized population step (bench/floors.py's floor):", ""]
    lines += [
        "| P | ms per step | floor ms | x floor | FLOP term ms | state term ms | "
        "XLA bytes ms (not judged) | kernels | µs per kernel |"
    ]
    lines += ["|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in read:
        per_kernel = r["seconds_per_kernel"]
        times = "-" if "times_floor" not in r else f"{r['times_floor']:.2f}"
        lines.append(
            f"| {r['population']} | {ms(r, 'seconds_per_update_step')} | "
            f"{ms(r, 'floor_seconds')} | {times} | {ms(r, 'compute_floor_seconds')} | "
            f"{ms(r, 'state_floor_seconds')} | {ms(r, 'xla_bytes_seconds')} | "
            f"{r['kernels_per_update_step']:.0f} | "
            f"{'-' if per_kernel is None else f'{1e6 * per_kernel:.1f}'} |"
        )
    return [*lines, *failed]


def device_lines(out_dir: Path, record: dict) -> list[str]:
    from fastpop.bench.device_report import table

    lines = ["### device"]
    for sweep in record.get("sweeps", []):
        problem = sweep.get("error") or sweep.get("skipped")
        if problem:
            sizes = f"P={sweep['populations']} E={sweep['envs_per_member']}"
            lines.append(f"- {sweep['env']} {sizes}: {problem}")
    for env_id, files in (record.get("envs") or {}).items():
        result = load(out_dir, files.get("json"))
        if result is not None:
            lines += ["", f"{env_id} (`{files['json']}`, `{files['png']}`):", "", table(result)]
        else:
            lines.append(f"- {env_id}: {len(files.get('rows_so_far', []))} row(s) when it stopped")
    return lines


def pipeline_lines(out_dir: Path, record: dict) -> list[str]:
    result = load(out_dir, record.get("json"))
    if result is None:
        return ["### pipeline", "no result"]
    lines = ["### pipeline", "", f"{result['env']}, P={result['population']} (`{record['json']}`):"]
    lines.append(f"- raw gymnasium: {result['raw_gymnasium_steps_per_s']:,.0f} env steps/s")
    for row in result["collection"]:
        lines.append(
            f"- {row['collectors']} collector(s): {row['env_steps_per_s']:,.0f} env steps/s "
            f"({row['per_collector_vs_raw']:.2f}x raw per collector)"
        )
    learner = result.get("learner")
    if learner is None:  # the phase stopped before its training run ended
        return [*lines, "- training: did not end"]
    if "busy_fraction_of_window" not in learner:
        return [*lines, "- training: a result without the learning window's fields"]
    bench = learner["benchmark"]
    lines += [
        f"- training with {learner['collectors']} collector(s): learner busy "
        f"{learner['busy_fraction_of_window']:.0%} of its {learner['window_seconds']:.1f} s "
        f"learning window; waiting for rows {learner['waiting_for_rows_fraction']:.0%} "
        f"({learner['waiting_for_rows_seconds']:.1f} s): bound by its {learner['bound_by']}",
        f"- apart from the window: evaluations {learner['evaluation_seconds']:.1f} s "
        f"({learner['evaluation_fraction_of_learning']:.0%}) and checkpoints "
        f"{learner['checkpoint_seconds']:.1f} s ({learner['checkpoint_fraction_of_learning']:.0%})"
        f" of the learning time; {learner['after_window_seconds']:.1f} s after it (the final "
        "evaluation, the stop's checkpoint, the workers' stop)",
        f"- {learner['run_agent_updates_per_s']:,.0f} agent-updates/s in the window against "
        f"{learner['update_benchmark_agent_updates_per_s']:,.0f} in the update benchmark at "
        f"K={bench['updates_per_call']}, batch {bench['batch_size']}, "
        f"{bench['replay_rows']:,} rows per member ({learner['rate_vs_benchmark']:.2f}x)",
    ]
    return lines


def pbt_lines(record: dict) -> list[str]:
    lines = ["### pbt"]
    for preset, run in (record.get("runs") or {}).items():
        if "skipped" in run:
            lines.append(f"- {preset}: {run['skipped']}")
            continue
        rate = run.get("updates_per_member_per_s")
        lines.append(
            f"- {preset}: {run['population']} members, {run['env']} ({run['collect_mode']} "
            f"mode), {run['wall_seconds']:.0f} s, {run['member_env_steps']:,} env steps and "
            f"{run['updates_per_member']:,} updates per member"
            + (f", {rate:.1f} updates/member/s ({run['rates_measured']})" if rate else "")
            + evaluation_pauses(run)
            + f"; plots: {', '.join(f'`{p}`' for p in run['plots']) or run.get('no_plot')}"
        )
    return lines


def evaluation_pauses(run: dict) -> str:
    """A pbt run's rate with the window's evaluation pauses taken out, beside the one with."""
    training = run.get("updates_per_member_per_s_without_evaluations")
    if not training:
        return ""
    return (
        f", {training:.1f} updates/member/s without the "
        f"{run['evaluation_seconds_in_window']:.1f} s spent evaluating in that window"
    )


def phase_table(manifest: dict) -> list[str]:
    """Each phase's status, seconds, cap and files, as the manifest has them."""
    lines = ["| phase | status | seconds | cap (s) | files |", "|---|---|---:|---:|---|"]
    for phase, entry in manifest["phases"].items():
        files = ", ".join(f"`{f}`" for f in entry.get("files", [])) or "-"
        status = entry["status"] + (f": {entry['error']}" if "error" in entry else "")
        lines.append(
            f"| {phase} | {status} | {entry.get('seconds', 0):.0f} | {entry['cap_seconds']:.0f} | "
            f"{files} |"
        )
    return lines


def write_readme(out_dir: Path, manifest: dict) -> Path:
    """README.md from the manifest and the phases' records (rewritten after each phase)."""
    records = {phase: read_record(out_dir, phase) for phase in PHASES}
    lines = ["# fastpop bench gpu", ""]
    if manifest.get("smoke"):
        lines += ["**Smoke sizes** (`--smoke`): tiny populations and envs; no target judged.", ""]
    elif manifest.get("programme") == "short":
        lines += [
            "**Short programme** (`--short`): the targets' sizes only, in one 10-minute command;"
            " `fastpop bench gpu` without it sweeps every size.",
            "",
        ]
    lines += [f"Last command: `{manifest.get('command', '')}`", "", "## Machine", ""]
    lines += environment_lines(records)
    lines += ["", "## Phases", "", *phase_table(manifest)]
    lines += ["", "## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    targets = judge_targets(out_dir, records)
    lines += [f"| {name} | {measured} | {judged} |" for name, measured, judged in targets]
    lines += ["", "## Results", ""]
    sections = {
        "update": lambda r: update_lines(out_dir, r),
        "device": lambda r: device_lines(out_dir, r),
        "pipeline": lambda r: pipeline_lines(out_dir, r),
        "pbt": pbt_lines,
    }
    for phase, section in sections.items():
        if records[phase] is not None:
            lines += [*section(records[phase]), ""]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines) + "\n")
    return path

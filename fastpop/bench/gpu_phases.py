"""The phases of `fastpop bench gpu`, each the existing benchmark at the sizes of the GPU
programme (or tiny ones, `--smoke`), writing its files into the output directory as it goes.

Each phase runs in a child process of its own (bench/gpu_runner.py) under a time cap, and keeps
`phase_<name>.json` up to date: what it has finished so far, `complete` once it has ended. A
phase given a deadline starts no new item (an algorithm, an env sweep, a training run) that
would begin after it.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path

from fastpop.agents import registry
from fastpop.bench.common import write_json
from fastpop.bench.gpu_plans import CONFIGS_DIR, RUN_OVERRIDES, TIGHT_DEFAULT


class PhaseRecord(dict):
    """`phase_<name>.json`: what the phase has done so far, written again at each `save`."""

    def __init__(self, out_dir: Path, phase: str, plan: dict, cap: float):
        super().__init__(phase=phase, complete=False, cap_seconds=cap, plan=plan, files=[])
        self.path = out_dir / f"phase_{phase}.json"
        self.start = time.perf_counter()
        self.deadline = self.start + cap

    def add_files(self, *paths: Path) -> None:
        """Paths in the output directory, recorded relative to it."""
        names = [p.relative_to(self.path.parent).as_posix() for p in paths]
        self["files"] += [name for name in names if name not in self["files"]]

    def time_left(self) -> float:
        return self.deadline - time.perf_counter()

    def skipped_past_cap(self, sweep: dict) -> bool:
        """Whether the phase's cap has passed before `sweep` began; if so the sweep is recorded
        as skipped and the phase as cut short."""
        if self.time_left() > 0:
            return False
        sweep["skipped"] = "the phase's time cap had passed"
        self["cut_short"] = True
        return True

    def log(self, line: str) -> None:
        """`line` printed after the seconds since the phase began (where its time went)."""
        print(f"[{time.perf_counter() - self.start:5.0f}s] {line}", flush=True)

    def save(self) -> None:
        self["seconds"] = time.perf_counter() - self.start
        write_json(dict(self), self.path)


def environment() -> dict:
    """What the child process's JAX sees: device, platform version (CUDA's), versions."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    return {
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_count": jax.device_count(),
        "platform_version": device.client.platform_version,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "environment_info": jax.print_environment_info(return_string=True),
    }


def run_phase(phase: str, out_dir: Path, plan: dict, cap: float, command: str, body=None) -> bool:
    """One phase in this process; whether it completed (its error is in its record if not).
    `body(out_dir, plan, record)` does its work: by default the benchmark phase of its name
    (the learning phase's is bench/gpu_learning.py's, which the runner passes)."""
    record = PhaseRecord(out_dir, phase, plan, cap)
    record["command"] = command
    bodies = {"update": update_phase, "device": device_phase, "pipeline": pipeline_phase}
    try:
        record["environment"] = environment()
        record.save()
        (body or bodies.get(phase, pbt_phase))(out_dir, plan, record)
        record["complete"] = True
    except Exception as error:  # recorded; the next phase still runs
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc()
        print(f"bench gpu: phase {phase} failed: {record['error']}", flush=True)
    record.save()
    return record["complete"]


def with_ratios(rows: list[dict]) -> list[dict]:
    """`rows` (of one algorithm, from one or more sweeps) with their ratios to the best
    baselines worked out over all of them."""
    from fastpop.bench import levers

    levers.add_speedups(rows)
    return rows


def update_phase(out_dir: Path, plan: dict, record: PhaseRecord) -> None:
    """`fastpop bench update` for each sweep, after the reference matmuls; sweeps of one
    algorithm share its files (rows merged, their ratios worked out again over all of them)."""
    from fastpop.bench.floors import matmul_gflops
    from fastpop.bench.update import UpdateBenchSettings, bench_update
    from fastpop.bench.update_report import write_results as write_update

    size = plan["matmul_size"]
    record["matmul_gflops_per_s"] = {
        "float32": matmul_gflops(size, precision="highest"),
        TIGHT_DEFAULT: matmul_gflops(size),
    }
    results, record["algos"], record["sweeps"] = {}, {}, []
    record.save()
    for algo, populations, impls in plan["sweeps"]:
        sweep = {"algo": algo, "populations": populations, "impls": impls}
        record["sweeps"].append(sweep)
        if record.skipped_past_cap(sweep):
            record["algos"].setdefault(algo, {"skipped": sweep["skipped"]})
            continue
        settings = UpdateBenchSettings(
            algo,
            plan["updates_per_call"],
            None,
            plan["min_seconds"],
            matmul_size=size,
            anatomy_from=plan["anatomy_from"],
            memory_megabytes=plan["memory_megabytes"],
        )
        earlier = results.get(algo, {}).get("rows", [])

        def partial(rows, algo=algo, earlier=earlier):
            record["algos"][algo] = {"rows_so_far": with_ratios([*earlier, *rows])}
            record.save()

        result = bench_update(settings, populations, impls, log=record.log, on_row=partial)
        # (a rate an earlier sweep measured and this one did not is kept: the memory bandwidth)
        rows = with_ratios([*earlier, *result["rows"]])
        results[algo] = result = results.get(algo, {}) | result | {"rows": rows}
        json_path, png_path = write_update(result, out_dir)
        record["algos"][algo] = {"json": json_path.name, "png": png_path.name}
        record.add_files(json_path, png_path)
        record.save()


def device_phase(out_dir: Path, plan: dict, record: PhaseRecord) -> None:
    """`fastpop bench device` for each sweep; sweeps of one env share its files (rows merged),
    and a sweep that fails (an env family not installed) is recorded and skipped."""
    from fastpop.bench.common import DeviceBenchSettings
    from fastpop.bench.device import bench_device
    from fastpop.bench.device_report import write_results as write_device
    from fastpop.envs import device_envs

    results, record["envs"], record["sweeps"] = {}, {}, []
    for env_id, populations, per_member in plan["sweeps"]:
        sweep = {"env": env_id, "populations": populations, "envs_per_member": per_member}
        record["sweeps"].append(sweep)
        if record.skipped_past_cap(sweep):
            continue
        earlier = results.get(env_id, {}).get("rows", [])

        def partial(rows, env_id=env_id, earlier=earlier):
            record["envs"][env_id] = {"rows_so_far": earlier + rows}
            record.save()

        try:
            kind = "discrete" if device_envs.discrete_actions(env_id) else "continuous"
            algo = registry.default_for(kind)
            settings = DeviceBenchSettings(
                env_id,
                None,
                algo,
                plan["seconds"],
                plan["chunk_len"],
                agent=plan["agent"],
                process_env=None,
            )
            result = bench_device(
                settings, populations, per_member, record["command"], on_row=partial
            )
        except Exception as error:  # MissingExtra, out of memory: the next sweep still runs
            sweep["error"] = f"{type(error).__name__}: {error}"
            record.save()
            continue
        result["rows"] = earlier + result["rows"]
        results[env_id] = result
        json_path, png_path = write_device(result, out_dir)
        record["envs"][env_id] = {"json": json_path.name, "png": png_path.name}
        record.add_files(json_path, png_path)
        record.save()


def pipeline_phase(out_dir: Path, plan: dict, record: PhaseRecord) -> None:
    """`fastpop bench pipeline`: collection per collector count, the learner's utilisation."""
    from fastpop.bench.pipeline import bench_pipeline, write_pipeline_results

    def save(result: dict) -> None:  # as each part ends: a capped phase keeps the earlier
        path = write_pipeline_results(result, out_dir)
        record["json"] = path.name
        record.add_files(path)
        record.save()

    result = bench_pipeline(
        plan["env"],
        plan["population"],
        plan["collectors"],
        plan["seconds"],
        plan["train_seconds"],
        train_collectors=plan["train_collectors"],
        warmup_steps=plan["warmup_steps"],
        agent=plan["agent"],
        on_part=save,
        train_env_steps=plan.get("train_env_steps"),
    )
    save(result)


def pbt_phase(out_dir: Path, plan: dict, record: PhaseRecord) -> None:
    """Each preset trained for a fixed wall time into `runs/<preset>/` (metrics, summary.json,
    the walltime-vs-return plot)."""
    from fastpop.bench.gpu_training import train_preset

    wall = min(plan["wall_seconds"], plan["wall_fraction"] * record["cap_seconds"])
    record["runs"] = {}
    for preset, overrides in plan["runs"]:
        if record.time_left() < wall:
            record["runs"][preset] = {"skipped": "too little of the phase's time cap was left"}
            record["cut_short"] = True
            continue
        run_dir = out_dir / "runs" / preset
        config = CONFIGS_DIR / f"{preset}.yaml"
        run = train_preset(config, [*RUN_OVERRIDES, *overrides], wall, run_dir)
        record["runs"][preset] = run
        record.add_files(*(out_dir / path for path in run["plots"]))
        record.save()


def read_record(out_dir: Path, phase: str) -> dict | None:
    path = out_dir / f"phase_{phase}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

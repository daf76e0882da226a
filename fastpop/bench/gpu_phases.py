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

from fastpop.bench.common import write_json

PHASES = ("update", "device", "pipeline", "pbt")
TIGHT_DEFAULT = "default"  # jnp.matmul's default precision: TF32 on NVIDIA GPUs that have it

# EvoRL's PBT-SAC iteration (its pbt_param_sac configs: workflow_steps_per_iter 1024, each step
# a rollout of 2 env steps and one SAC update of batch 256), per member. The pbt phase trains
# sac_pbt_brax_ant at that ratio (replay.samples_per_insert = 256 / 2).
EVORL_ITERATION = {"updates": 1024, "env_steps": 2048}
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

# Every pbt-phase run: no replay in its stop checkpoint (GBs at these sizes), no TensorBoard.
RUN_OVERRIDES = ["checkpoint.replay=false", "log.tensorboard=false"]
FULL_PLANS = {
    "update": {  # (algorithm, population sizes, implementations): each a product, most wanted
        # first; sweeps of one algorithm share its files
        "sweeps": [
            (algo, sizes, ["vectorized", "sequential", "torch"])
            for algo, sizes in (
                ("td3", [1, 2, 4, 8, 16, 32, 64, 80, 128, 256]),
                ("sac", [1, 2, 4, 8, 16, 32, 64, 80, 128, 256]),
                ("dqn", [1, 2, 4, 8, 16, 32, 64]),
            )
        ],
        "min_seconds": 1.0,
        "updates_per_call": 10,
        "matmul_size": None,
        "anatomy_from": 80,  # the targets' sizes: XLA's kernels and the floors (bench/anatomy)
        "memory_megabytes": None,
    },
    "device": {  # (env id, population sizes, envs per member): each a product, most wanted first
        "sweeps": [
            ("brax/halfcheetah", [16, 64, 256], [1]),
            ("brax/ant", [64, 256], [4]),
            ("brax/halfcheetah", [64], [4, 16]),
            ("brax/ant", [256], [1, 16]),
            ("gymnax/Pendulum-v1", [16, 256], [1, 16]),
            ("playground/CartpoleBalance", [64, 256], [4]),
        ],
        "seconds": 3.0,
        "chunk_len": 32,
        "agent": None,  # the algorithm's networks (256-256)
    },
    "pipeline": {
        "env": "HalfCheetah-v5",
        "population": 80,
        "collectors": [1, 2, 4, 8, 14],
        "seconds": 6.0,
        "train_seconds": 100.0,
        "train_collectors": 14,
        "warmup_steps": 5_000,
        "agent": None,  # the paper's networks
    },
    "pbt": {  # each run's train.max_wall_seconds: wall_seconds, at most wall_fraction of the cap
        "wall_seconds": 120.0,
        "wall_fraction": 0.36,
        "runs": [
            ("td3_pbt_halfcheetah", ["eval.episodes=2", "collect.num_collectors=14"]),
            ("sac_pbt_brax_ant", ["eval.episodes=2", "replay.samples_per_insert=128"]),
        ],
    },
}
# What issue 47's targets read at P = 80: the vectorized step against its floor and its
# ratios to the best sequential JAX and PyTorch rows; with the bf16 lever.
TARGET_ROWS = ["vectorized", "sequential-in-one-program", "torch-func", "vectorized+bf16"]
# `--short`: issue 47's targets in one 10-minute command (a lease of 15 device minutes, machine
# start included): TD3 and SAC at P = 80 and 256 against their floors, the best sequential JAX
# and PyTorch rows, the bf16 lever (most wanted first: a phase cut by its cap keeps the rows
# it finished); brax/ant at 16 envs per member; the 80-member learner with 14
# collectors; the 256-member SAC PBT on brax/ant. Not `torch-compile`: it compiles each member's
# step on its own (~1.6 s each on an H100), minutes at these sizes.
SHORT_PLANS = {
    "update": {
        **FULL_PLANS["update"],
        # Only the rows the targets read, and the bf16 lever: each size compiles its programs
        # anew (the update alone 8-12 s on an H100 or H200), and the H100's run of 2026-11-27
        # spent its 263 s cap on TD3 at P = 80 alone, with nine rows. The rows measured there
        # and since (the eager baselines, the levers no faster) are left to `bench update`.
        "sweeps": [
            *((algo, [80], TARGET_ROWS) for algo in ("td3", "sac")),
            *((algo, [256], ["vectorized"]) for algo in ("td3", "sac")),
        ],
        "min_seconds": 0.5,
        "anatomy_from": 1,
    },
    "device": {
        **FULL_PLANS["device"],
        "sweeps": [("brax/ant", [256], [16])],
        "seconds": 1.5,
    },
    "pipeline": {
        **FULL_PLANS["pipeline"],
        "collectors": [14],
        "seconds": 4.0,
        "train_seconds": 35.0,
    },
    "pbt": {
        "wall_seconds": 90.0,  # learning from ~35 s on a GPU
        "wall_fraction": 0.79,
        "runs": [
            (
                "sac_pbt_brax_ant",
                # 16 envs per member: the 2048 env steps of an EvoRL iteration in 128 steps of
                # the 4096 lanes (the H200's 1024 lanes left the GPU short of work)
                [
                    "eval.episodes=2",
                    "eval.interval=20000",
                    "replay.samples_per_insert=128",
                    "collect.envs_per_member=16",
                ],
            ),
        ],
    },
}
_TINY_REPLAY = ["replay.capacity=2000", "replay.min_size=200", "collect.warmup_steps=200"]
_TINY_AGENT = ["agent.hidden_sizes=[32,32]", "agent.batch_size=32", "population.size=2"]
_TINY_PBT = ["pbt.bottom_fraction=0.5", "pbt.top_fraction=0.5"]  # of 2 members: 1 each
_TINY = [*_TINY_REPLAY, *_TINY_AGENT, *_TINY_PBT, "eval.interval=200", "eval.episodes=1"]
SMOKE_PLANS = {
    "update": {
        # One algorithm, one size: the phase's path, not its sweep (the suite runs it; each
        # program is seconds of XLA on a CPU, and DQN's Nature CNN compiles for long).
        "sweeps": [("td3", [1], ["vectorized", "sequential"])],
        "min_seconds": 0.03,
        "updates_per_call": 2,
        "matmul_size": 128,
        "anatomy_from": 1,
        "memory_megabytes": 8,
    },
    "device": {
        # P=2, E=2 at these sizes is `fastpop bench device`'s tiny test: its programs come from
        # the suite's shared compilation cache whichever of the two runs second. One row: each
        # compiles three programs (sweeps of one env merging into one file: unit-tested).
        "sweeps": [("gymnax/Pendulum-v1", [2], [2])],
        "seconds": 0.06,
        "chunk_len": 8,
        "agent": {"hidden_sizes": [16, 16]},
    },
    "pipeline": {
        "env": "Pendulum-v1",
        "population": 2,
        "collectors": [1],
        "seconds": 0.3,
        "train_seconds": 2.5,
        "train_collectors": 1,
        "warmup_steps": 256,
        "agent": {"hidden_sizes": [16, 16], "batch_size": 32},
    },
    "pbt": {
        "wall_seconds": 3.0,
        "wall_fraction": 0.36,
        "runs": [
            ("td3_pbt_halfcheetah", [*_TINY, "env.id=Pendulum-v1", "collect.num_collectors=1"]),
            (
                "sac_pbt_brax_ant",
                [
                    *_TINY,
                    "env.id=gymnax/Pendulum-v1",
                    "collect.envs_per_member=1",
                    "collect.chunk_len=16",
                    "train.updates_per_call=8",
                    "pbt.interval=400",
                ],
            ),
        ],
    },
}
# Seconds each phase may run (bench/gpu_runner.py kills it after): one remote 10-minute
# command holds `update`, one `device`, one `pipeline` and `pbt`; about 25 minutes in all.
FULL_CAPS = {"update": 450.0, "device": 510.0, "pipeline": 220.0, "pbt": 320.0}
SMOKE_CAPS = {"update": 120.0, "device": 120.0, "pipeline": 120.0, "pbt": 120.0}
# What the phases took on GPUs before: brax/ant's device row ~85 s on the H200 (35 s of it
# compiling) and ~95 s on the H100 (its compiles and warm-up at 10 s of measuring); the learner
# run 86 s, the PBT run 114 s (H100). The update's ten rows are estimated from the H100's
# kernel-time run (six vectorized rows with their anatomy, 137 s): ~150 s. Their sum, with
# each phase's grace time, fits one 10-minute command (tests/test_bench_gpu.py).
SHORT_CAPS = {"update": 190.0, "device": 100.0, "pipeline": 95.0, "pbt": 125.0}
# Each programme's plans and caps, by the flag that picks it (none: "full").
PROGRAMMES = {
    "full": (FULL_PLANS, FULL_CAPS),
    "short": (SHORT_PLANS, SHORT_CAPS),
    "smoke": (SMOKE_PLANS, SMOKE_CAPS),
}


def with_run_overrides(plans: dict, overrides: list[str]) -> dict:
    """`plans` with `overrides` (`--set` values) after each pbt-phase run's own, each run's
    config loaded once to check them (a ConfigError names what was wrong)."""
    from fastpop.config import load_config

    if not overrides:
        return plans
    runs = [(preset, [*own, *overrides]) for preset, own in plans["pbt"]["runs"]]
    for preset, run_overrides in runs:
        load_config(CONFIGS_DIR / f"{preset}.yaml", [*RUN_OVERRIDES, *run_overrides])
    return {**plans, "pbt": {**plans["pbt"], "runs": runs}}


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


def run_phase(phase: str, out_dir: Path, plan: dict, cap: float, command: str) -> bool:
    """One phase in this process; whether it completed (its error is in its record if not)."""
    record = PhaseRecord(out_dir, phase, plan, cap)
    record["command"] = command
    try:
        record["environment"] = environment()
        record.save()
        {"update": update_phase, "device": device_phase, "pipeline": pipeline_phase}.get(
            phase, pbt_phase
        )(out_dir, plan, record)
        record["complete"] = True
    except Exception as error:  # recorded; the next phase still runs
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc()
        print(f"bench gpu: phase {phase} failed: {record['error']}", flush=True)
    record.save()
    return record["complete"]


def update_phase(out_dir: Path, plan: dict, record: PhaseRecord) -> None:
    """`fastpop bench update` for each sweep, after the reference matmuls; sweeps of one
    algorithm share its files (rows merged, their ratios worked out again over all of them)."""
    from fastpop.bench import levers
    from fastpop.bench.update import UpdateBenchSettings, bench_update, matmul_gflops
    from fastpop.bench.update import write_results as write_update

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
        if record.time_left() <= 0:
            sweep["skipped"] = "the phase's time cap had passed"
            record["algos"].setdefault(algo, {"skipped": sweep["skipped"]})
            record["cut_short"] = True
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

        def merged(rows, earlier=earlier) -> list[dict]:
            rows = [*earlier, *rows]
            levers.add_speedups(rows)
            return rows

        def partial(rows, algo=algo, merged=merged):
            record["algos"][algo] = {"rows_so_far": merged(rows)}
            record.save()

        result = bench_update(settings, populations, impls, log=record.log, on_row=partial)
        # (a rate an earlier sweep measured and this one did not is kept: the memory bandwidth)
        results[algo] = result = results.get(algo, {}) | result | {"rows": merged(result["rows"])}
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
        if record.time_left() <= 0:
            sweep["skipped"] = "the phase's time cap had passed"
            record["cut_short"] = True
            continue
        earlier = results.get(env_id, {}).get("rows", [])

        def partial(rows, env_id=env_id, earlier=earlier):
            record["envs"][env_id] = {"rows_so_far": earlier + rows}
            record.save()

        try:
            algo = "dqn" if device_envs.discrete_actions(env_id) else "td3"
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

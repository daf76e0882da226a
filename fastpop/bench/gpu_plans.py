"""What `fastpop bench gpu` measures: each phase's plan (its sizes, rows and runs) and time cap
for the full programme, `--short` (issue 47's targets in one 10-minute command) and `--smoke`
(tiny sizes on a CPU, what the suite runs); bench/gpu_phases.py runs them."""

from __future__ import annotations

from pathlib import Path

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

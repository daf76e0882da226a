"""What `fastpop bench gpu` measures: each phase's plan (its sizes, rows and runs) and time cap
for the full programme, `--short` (the GPU targets' sizes in two remote calls), `--learning`
(the learning programme's fixed-time training runs in one remote call) and `--smoke` (tiny
sizes on a CPU, what the suite runs, of either); bench/gpu_phases.py and bench/gpu_learning.py
run them."""

from __future__ import annotations

from pathlib import Path

from fastpop.agents import dqn, sac, td3

# Every phase, in the order a programme runs those it has plans for (`PROGRAMMES`).
PHASES = ("update", "device", "pipeline", "pbt", "learning")
BENCHMARK_PHASES = PHASES[:4]  # the full, --short and --smoke programmes'
MANIFEST = "bench_gpu.json"  # marks a directory `fastpop bench gpu` wrote
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
                (td3.NAME, [1, 2, 4, 8, 16, 32, 64, 80, 128, 256]),
                (sac.NAME, [1, 2, 4, 8, 16, 32, 64, 80, 128, 256]),
                (dqn.NAME, [1, 2, 4, 8, 16, 32, 64]),
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
# `--short`: the GPU targets in two remote calls of a 15-minute lease (`SHORT_CALLS`):
# TD3 and SAC at P = 80 against their floor, the best sequential JAX row and the LeanRL-class
# PyTorch rows (torch.compile, CUDA graphs, TF32); then at P = 256; the single-agent P = 1
# reference; TF32 off, named; most wanted first (a phase cut by its cap keeps the rows it
# finished). Then the 80-member learner with 14 collectors and the 256-member SAC PBT on
# brax/ant. `torch-func` (eager, vmapped) and the levers measured before are left to
# `bench update`; `torch-compile` (each member compiled apart) too. After the targets' rows and
# before the references measured before (P = 1, TF32 off; H200 at 81ed214: 274 s of the 330),
# the lever not yet measured on a GPU: TD3's MLPs in fused Pallas kernels at two tilings, timed
# in alternating rounds with a vectorized row of their own (the targets read each row's first).
TARGET_ROWS = ["vectorized", "sequential-in-one-program", "torch-leanrl"]
PALLAS_ROWS = ["vectorized", "vectorized+pallas-mlp", "vectorized+pallas-mlp-rows64"]
TARGET_ALGOS = (td3.NAME, sac.NAME)  # the GPU targets' algorithms (bench/gpu_report.py)
SHORT_PLANS = {
    "update": {
        **FULL_PLANS["update"],
        "sweeps": [
            *((algo, [80], TARGET_ROWS) for algo in TARGET_ALGOS),
            *((algo, [256], ["vectorized", "torch-leanrl"]) for algo in TARGET_ALGOS),
            (td3.NAME, [80], PALLAS_ROWS),
            *((algo, [1], ["vectorized", "torch-leanrl"]) for algo in TARGET_ALGOS),
            *((algo, [80], ["torch-leanrl-fp32"]) for algo in TARGET_ALGOS),
        ],
        "min_seconds": 0.5,
        "anatomy_from": 80,
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
_TINY_PENDULUM_DEVICE = [
    *_TINY,
    "env.id=gymnax/Pendulum-v1",
    "collect.envs_per_member=1",
    "collect.chunk_len=16",
    "train.updates_per_call=8",
]
SMOKE_PLANS = {
    "update": {
        # One algorithm, one size: the phase's path, not its sweep (the suite runs it; each
        # program is seconds of XLA on a CPU, and DQN's Nature CNN compiles for long).
        "sweeps": [(td3.NAME, [1], ["vectorized", "sequential"])],
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
        # ended by its env steps (a few dozen update calls after the first), not by a wall
        # time that a loaded CPU compiling from a cold cache can spend before its first update
        "train_seconds": 60.0,
        "train_env_steps": 512,
        "train_collectors": 1,
        "warmup_steps": 256,
        "agent": {"hidden_sizes": [16, 16], "batch_size": 32},
    },
    "pbt": {
        "wall_seconds": 3.0,
        "wall_fraction": 0.36,
        "runs": [
            ("td3_pbt_halfcheetah", [*_TINY, "env.id=Pendulum-v1", "collect.num_collectors=1"]),
            ("sac_pbt_brax_ant", [*_TINY_PENDULUM_DEVICE, "pbt.interval=400"]),
        ],
    },
}
# Seconds each phase may run (bench/gpu_runner.py kills it after): one remote 10-minute
# command holds `update`, one `device`, one `pipeline` and `pbt`; about 25 minutes in all.
FULL_CAPS = {"update": 450.0, "device": 510.0, "pipeline": 220.0, "pbt": 320.0}
SMOKE_CAPS = {"update": 120.0, "device": 120.0, "pipeline": 120.0, "pbt": 120.0}
# What the phases took on GPUs before: the learner run 86 s and the PBT run 114 s (H100); the
# JAX update rows 8-12 s of compiling each; a LeanRL-class row's torch.compile is not yet
# measured on a GPU (its one-step compile is ~10-20 s on this CPU). The device phase is not
# in --short: brax/ant at 16 envs per member was measured on the H100 (results/gpu/README.md).
SHORT_CAPS = {"update": 330.0, "device": 100.0, "pipeline": 95.0, "pbt": 125.0}
# --short's remote calls, one device-tool command each (each at most REMOTE_LIMIT_SECONDS):
# the update first (what a skeptic reads), then the learner and the PBT run.
SHORT_CALLS = (("update",), ("pipeline", "pbt"))
REMOTE_LIMIT_SECONDS = 600.0  # the device tool's limit on one command
INSTALL_SECONDS = 30.0  # the carried wheels into /tmp/site (~10 s on the H100)
PACK_SECONDS = 5.0  # the output directory packed after each phase (no checkpoints: MBs)
KILL_MARGIN_SECONDS = 15.0  # `timeout -k`: SIGKILL this long after the command's SIGTERM
SAFETY_SECONDS = 30.0  # every call at least this far inside the remote limit


def grace_seconds(cap: float) -> float:
    """How long a capped phase's child gets between SIGTERM and SIGKILL (gpu_runner.stop)."""
    return min(30.0, 0.1 * cap + 2.0)


def call_seconds(phases, caps: dict) -> float:
    """The most one remote call of `phases` can take: each phase's cap and grace, its SIGKILL
    wait and packing, the install, and the outer timeout's kill margin."""
    phases_time = sum(caps[p] + grace_seconds(caps[p]) + 10.0 + PACK_SECONDS for p in phases)
    return INSTALL_SECONDS + phases_time + KILL_MARGIN_SECONDS


# `--learning`: the learning programme, one remote call (LEARNING_CALL_SECONDS), its
# runs in this order, each packed as soon as written (bench/gpu_learning.py). A run trains for
# `wall_seconds` of wall time (compilation included), less where the phase's cap leaves less
# than that and `reserve_seconds` (a run's build before its clock starts; its final evaluation,
# stop checkpoint and plots after); below `min_wall_seconds` it is skipped, an `optional` one
# without cutting the phase short. `time_marks`: the seconds its table reads returns at.
WALL_BOUND = "train.total_env_steps=1000000000"  # per member: the wall time ends the run
# The preset as it is, on the task whose FastTD3 curve is published (G1JoystickFlatTerrain: 4.49
# at 433 s, 5.12M env steps on an A100), ended by its wall time; an evaluation every 250,000
# env steps per member. Its robot's models are installed by learning_programme.sh.
_RECIPE_GPU = [WALL_BOUND]
# sac_pbt_brax_ant at EvoRL's update ratio (replay.samples_per_insert = 256 / 2: one update of
# batch 256 per 2 env steps) on 16 envs per member, as in the H200's GPU-targets run (212
# updates/member/s, ~455 env steps/member/s while learning, an evaluation ~5 s): a warm-up of
# 2 EvoRL iterations (EvoRL's own is 2048 steps) and a PBT round at every evaluation, every
# 3 iterations, so that its 90 s hold 4 rounds (at ~29, 47, 66 and 84 s on the H200).
_PBT_GPU = [
    WALL_BOUND,
    "eval.episodes=2",
    "replay.samples_per_insert=128",
    "collect.envs_per_member=16",
    "collect.warmup_steps=4096",
    "replay.min_size=4096",
    "eval.interval=6144",
    "pbt.interval=6144",
]
PBT_OFF = "strategy=independent"  # the same members and starting draws, nothing copied
RECIPE_PRESET, PBT_PRESET = "td3_recipe_playground_g1_joystick", "sac_pbt_brax_ant"


def learning_runs(recipe: list, pbt: list, seconds: tuple, marks: tuple) -> list[dict]:
    """The recipe, the PBT run and the same population with PBT off, with these overrides,
    wall seconds (recipe's, PBT's) and time marks (recipe's, PBT's). The recipe runs its whole
    time or not at all (the learning programme asks for 5 minutes); the PBT run needs 3/4 of
    its time (3 rounds); PBT off, optional, the PBT run's time."""
    recipe_run = {"name": RECIPE_PRESET, "preset": RECIPE_PRESET, "kind": "recipe"}
    pbt_run = {"preset": PBT_PRESET, "wall_seconds": seconds[1], "time_marks": marks[1]}
    return [
        recipe_run
        | {"overrides": recipe, "wall_seconds": seconds[0], "min_wall_seconds": seconds[0]}
        | {"time_marks": marks[0]},
        pbt_run
        | {"name": PBT_PRESET, "kind": "pbt", "overrides": pbt}
        | {"min_wall_seconds": 0.75 * seconds[1]},
        pbt_run
        | {"name": f"{PBT_PRESET}_pbt_off", "kind": "pbt_off", "overrides": [*pbt, PBT_OFF]}
        | {"min_wall_seconds": seconds[1], "optional": True},
    ]


LEARNING_PLANS = {
    "learning": {
        "runs": learning_runs(
            _RECIPE_GPU, _PBT_GPU, (300.0, 90.0), ((60, 120, 180, 240, 300), (30, 60, 90))
        ),
        # the H200's PBT phase (the GPU targets' run at 81ed214) took 16 s besides its run's
        # 97 s (the child's start, the build, the plot), and the run 7 s past its 90 s (final
        # evaluation, stop checkpoint)
        "reserve_seconds": 25.0,
    }
}
# The smoke form: the recipe on Playground's CartpoleBalance (MJX, as the humanoid), the PBT
# runs on gymnax's Pendulum-v1, each ended by its env steps (a busy CPU's compiles can take
# longer than a short wall time) well inside its wall.
_RECIPE_TINY = [
    "env.id=playground/CartpoleBalance",
    "env.episode_length=100",
    "population.size=2",
    "agent.hidden_sizes=[32,32]",
    "agent.actor_hidden_sizes=[32,32]",
    "agent.batch_size=64",
    "replay.capacity=4000",
    "replay.min_size=128",
    "collect.warmup_steps=128",
    "collect.envs_per_member=4",
    "collect.chunk_len=8",
    "train.updates_per_call=4",
    "train.total_env_steps=640",
    "eval.interval=256",
    "eval.episodes=1",
]
_PBT_TINY = [*_TINY_PENDULUM_DEVICE, "pbt.interval=200", "train.total_env_steps=1600"]
LEARNING_SMOKE_PLANS = {
    "learning": {
        "runs": learning_runs(_RECIPE_TINY, _PBT_TINY, (60.0, 60.0), ((5, 10, 20), (5, 10))),
        "reserve_seconds": 10.0,
    }
}
# One remote call: the phase's cap, its grace and SIGKILL wait, the packing, the install and
# the kill margin (call_seconds) within LEARNING_CALL_SECONDS, 60 s inside the remote limit.
LEARNING_CAPS = {"learning": 450.0}
LEARNING_SMOKE_CAPS = {"learning": 240.0}
LEARNING_CALL_SECONDS = 540.0

# Each programme's plans and caps, by the flags that pick it (none: "full").
PROGRAMMES = {
    "full": (FULL_PLANS, FULL_CAPS),
    "short": (SHORT_PLANS, SHORT_CAPS),
    "smoke": (SMOKE_PLANS, SMOKE_CAPS),
    "learning": (LEARNING_PLANS, LEARNING_CAPS),
    "learning_smoke": (LEARNING_SMOKE_PLANS, LEARNING_SMOKE_CAPS),
}


def training_runs(plans: dict) -> list[tuple[str, list[str]]]:
    """(preset, overrides) of every training run in `plans`: the pbt phase's, the learning's."""
    runs = list(plans.get("pbt", {}).get("runs", []))
    return runs + [
        (run["preset"], run["overrides"]) for run in plans.get("learning", {}).get("runs", [])
    ]


def with_run_overrides(plans: dict, overrides: list[str]) -> dict:
    """`plans` with `overrides` (`--set` values) after each training run's own (the pbt and
    learning phases'), each run's config loaded once to check them (a ConfigError names what
    was wrong)."""
    from fastpop.config import load_config

    if not overrides:
        return plans
    plans = dict(plans)
    if "pbt" in plans:
        runs = [(preset, [*own, *overrides]) for preset, own in plans["pbt"]["runs"]]
        plans["pbt"] = {**plans["pbt"], "runs": runs}
    if "learning" in plans:
        runs = [
            run | {"overrides": [*run["overrides"], *overrides]}
            for run in plans["learning"]["runs"]
        ]
        plans["learning"] = {**plans["learning"], "runs": runs}
    for preset, run_overrides in training_runs(plans):
        load_config(CONFIGS_DIR / f"{preset}.yaml", [*RUN_OVERRIDES, *run_overrides])
    return plans

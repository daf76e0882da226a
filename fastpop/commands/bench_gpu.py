"""`fastpop bench gpu`: the GPU programme (update, device, pipeline, pbt phases) as one command,
each phase under its own time cap, its files written into --out as soon as it ends."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from fastpop.commands.args import comma_list, fail

# Kept in step with bench/gpu_plans.py's PHASES (tests/test_bench_gpu.py checks), so that
# building the parser imports no benchmark.
PHASES = ("update", "device", "pipeline", "pbt", "learning")


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget {text!r}: not a number of seconds") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"budget {text!r}: must be a finite number > 0")
    return value


def add_gpu_parser(benchmarks) -> None:
    gpu = benchmarks.add_parser(
        "gpu",
        help="the whole GPU programme in phases: update, device, pipeline, pbt; --learning: "
        "fixed-time learning runs (the TD3 recipe on a Playground humanoid, SAC PBT on brax/ant)",
        description="Runs the GPU measurements in phases, each in a process of its own killed "
        "at its time cap, each writing its JSON / PNG into --out as soon as it ends: update "
        "(TD3 / SAC at P up to 256, DQN up to 64; vectorized, sequential, PyTorch; matmul at "
        "float32 and default precision), device (brax halfcheetah and ant, gymnax, Playground "
        "at P up to 256, E 1..16), pipeline (1-14 collectors on HalfCheetah-v5, 80-member "
        "TD3's learner utilisation), pbt (td3_pbt_halfcheetah and sac_pbt_brax_ant for a fixed "
        "wall time). DIR/README.md sums up the machine, the phases and the targets met or "
        "missed. Default caps: update 450 s, device 510 s, pipeline 220 s, pbt 320 s. "
        "--learning runs the learning phase instead: the TD3 recipe on Playground's "
        "G1JoystickFlatTerrain for 300 s (its robot's models in place: "
        "results/gpu/menagerie_models.py), 256-member SAC PBT on brax/ant for 90 s (and, "
        "where the cap leaves time, the same population with PBT off), each packed as soon "
        "as written, with their tables beside FastTD3's and EvoRL's published figures (cap 450 s).",
    )
    gpu.add_argument("--out", type=Path, required=True, help="the results directory")
    gpu.add_argument(
        "--phases",
        type=comma_list(str, "phase", PHASES),
        default=None,
        help=f"phases to run, comma-separated from {','.join(PHASES)} (default: all of the "
        "programme's: update, device, pipeline, pbt; with --learning, learning)",
    )
    gpu.add_argument(
        "--budget-seconds",
        type=positive_seconds,
        default=None,
        help="seconds for the chosen phases together, shared in proportion to their default "
        "caps (default: the sum of their caps)",
    )
    gpu.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value of every training run of the pbt and learning phases "
        "(repeatable), e.g. agent.compute_dtype=bfloat16",
    )
    gpu.add_argument(
        "--pack",
        type=Path,
        default=None,
        metavar="TARBALL",
        help="after every phase, pack --out (less run checkpoints) into this .tgz, so that a "
        "command cut short still leaves what finished",
    )
    add_programme_arguments(gpu)


def add_programme_arguments(gpu) -> None:
    """Which sizes and caps the phases run at (`programme_name`): --short, --smoke, --learning."""
    programme = gpu.add_mutually_exclusive_group()
    programme.add_argument(
        "--short",
        action="store_true",
        help="the GPU targets' sizes only, in two remote calls (--phases update; --phases "
        "pipeline,pbt): TD3 then SAC at P 80 (vectorized against its floor, the best "
        "sequential JAX row, the LeanRL-class PyTorch row), then P 256, the P = 1 references "
        "and PyTorch with TF32 off; the 80-member learner with 14 collectors, the 256-member "
        "SAC PBT on brax/ant (caps: update 330 s, pipeline 95 s, pbt 125 s)",
    )
    programme.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes and cheap envs (gymnax / classic control / Playground's "
        "CartpoleBalance): the same phases on a CPU in about a minute",
    )
    gpu.add_argument(
        "--learning",
        action="store_true",
        help="the learning runs (the TD3 recipe on Playground G1JoystickFlatTerrain, the "
        "256-member SAC PBT on brax/ant, PBT off where time is left) in one remote call of at "
        "most 540 s (with --smoke, its smoke form; not with --short)",
    )


def check_out_dir(out: Path, manifest_name: str) -> str | None:
    """Why --out cannot be written, or None: absent, empty, or written by `fastpop bench gpu`
    before (its manifest there; its phases' files are replaced, nothing else is touched)."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is a file; choose a directory"
    if not out.exists() or not any(out.iterdir()):
        return None
    if not (out / manifest_name).is_file():
        held = sorted(entry.name for entry in out.iterdir())
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        return (
            f"--out {out}: already exists and was not written by `fastpop bench gpu` (it has no "
            f"{manifest_name}; it holds {shown}); nothing was written. Choose an absent or "
            "empty directory"
        )
    return None


def gpu_command(args: argparse.Namespace) -> str:
    """The `fastpop bench gpu` command these arguments stand for."""
    words = ["fastpop", "bench", "gpu", "--out", str(args.out)]
    if args.phases is not None:
        words += ["--phases", ",".join(args.phases)]
    if args.budget_seconds is not None:
        words += ["--budget-seconds", f"{args.budget_seconds:g}"]
    for override in args.overrides:
        words += ["--set", override]
    if args.pack is not None:
        words += ["--pack", str(args.pack)]
    flags = [name for name in ("short", "learning", "smoke") if getattr(args, name)]
    return shlex.join(words + [f"--{flag}" for flag in flags])


def programme_name(args: argparse.Namespace) -> str:
    """The sizes and caps the flags pick (a key of gpu_plans.PROGRAMMES): "full", "short",
    "smoke", "learning" or "learning_smoke"."""
    if args.learning:
        return "learning_smoke" if args.smoke else "learning"
    return "smoke" if args.smoke else "short" if args.short else "full"


def run_gpu(args: argparse.Namespace) -> int:
    """The `fastpop bench gpu` handler: 0 when every chosen phase ended, 1 otherwise."""
    from fastpop.bench import gpu_plans
    from fastpop.bench.gpu_runner import MANIFEST, run_phases
    from fastpop.config import ConfigError

    if args.learning and args.short:
        return fail("argument --learning: not allowed with argument --short")
    if problem := check_out_dir(args.out, MANIFEST):
        return fail(problem)
    plans, caps = gpu_plans.PROGRAMMES[programme_name(args)]
    chosen = list(plans) if args.phases is None else args.phases
    if outside := [phase for phase in chosen if phase not in plans]:
        return fail(
            f"--phases {','.join(outside)}: not in this programme, whose phases are "
            f"{', '.join(plans)}"
        )
    phases = [phase for phase in gpu_plans.PHASES if phase in chosen]
    try:  # checked before any phase runs: a bad override leaves nothing behind
        plans = gpu_plans.with_run_overrides(plans, args.overrides)
    except ConfigError as error:
        return fail(f"--set: {error}")
    if args.budget_seconds is not None:
        scale = args.budget_seconds / sum(caps[phase] for phase in phases)
        caps = {phase: cap * scale for phase, cap in caps.items()}
    command, programme = gpu_command(args), programme_name(args)
    manifest = run_phases(args.out, phases, plans, caps, command, programme, pack=args.pack)
    print(f"wrote {args.out / 'README.md'}")
    statuses = [manifest["phases"][phase]["status"] for phase in phases]
    return 0 if all(status == "done" for status in statuses) else 1

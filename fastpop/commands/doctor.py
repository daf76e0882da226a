"""`fastpop doctor`: what fastpop sees on this machine, and a short update run on its device.

It prints the accelerator JAX uses (or the CPU), its memory, the JAX, jaxlib and CUDA versions,
which environment families work (each one built, not only imported: gymnax 0.0.9 imports cleanly
and fails at its first `make` without `six`), and a TD3 population's update timed on the device.
Exit 0 when nothing is wrong, 1 when something is: an NVIDIA GPU that JAX does not use (with the
command that fixes it), or an installed family that fails to build. A family that is not
installed is not a problem; the line names the extra that adds it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

CUDA_INSTALL = "python -m pip install -e '.[cuda]'"
CUDA_PLUGINS = ("jax-cuda12-plugin", "jax-cuda13-plugin")
SMOKE_POPULATION = 8  # members of the TD3 population whose update is timed
SMOKE_AGENT: dict = {}  # agent config fields over the benchmark's defaults (tests shrink it)


class Family(NamedTuple):
    """An environment family, checked by building `env_id`; `package`: the module it needs."""

    label: str
    env_id: str
    package: str
    extra: str | None  # None: in fastpop's own dependencies


def families() -> list[Family]:
    """Process mode's simulators (gymnasium) and every device family (envs.device_envs)."""
    from fastpop.envs import device_envs

    process = [
        Family("gymnasium classic control", "Pendulum-v1", "gymnasium", None),
        Family("gymnasium MuJoCo", "HalfCheetah-v5", "mujoco", "mujoco"),
        Family("Atari (ale-py)", "Pong", "ale_py", "atari"),
    ]
    device = [
        Family(adapter.PREFIX.rstrip("/"), adapter.PROBE_ID, adapter.PACKAGE, adapter.EXTRA)
        for adapter in device_envs.families()
    ]
    return process + device


def add_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "doctor",
        help="what fastpop sees: device, memory, versions, env families, a short update run",
        description="Print the device JAX uses and its memory, the JAX/jaxlib/CUDA versions, "
        "which environment families build, and time a population's update on that device. "
        "Exit 1 if an NVIDIA GPU is present but JAX does not use it (the fix is printed) or an "
        "installed environment family fails.",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="timed seconds of the update run, after its compile (default: 5)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    from fastpop.commands.args import fail

    if not args.seconds > 0:
        return fail(f"--seconds must be a positive number of seconds, got {args.seconds}")
    problems = []
    print(f"fastpop {_version('fastpop')}, Python {platform.python_version()}")
    problems += report_device()
    problems += report_families()
    try:
        report_update(args.seconds)
    except Exception as error:  # the smoke run's failure is the report, not a crash
        problems.append(f"the update run failed: {type(error).__name__}: {error}")
    if problems:
        print("\nproblems:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("\nno problems found")
    return 0


def report_device() -> list[str]:
    """The JAX line, the device and memory lines, CUDA's; a GPU JAX does not use is a problem."""
    import jax

    device = jax.devices()[0]
    print(f"JAX {jax.__version__}, jaxlib {_version('jaxlib')}, backend {device.platform}")
    print(f"device: {len(jax.devices())} x {device.device_kind} ({device.platform})")
    print(f"memory: {_memory_line(device)}")
    plugins = {name: _version(name) for name in CUDA_PLUGINS if _version(name) != "not installed"}
    cuda = ", ".join(f"{name} {version}" for name, version in plugins.items()) or "no CUDA plugin"
    if device.platform == "gpu":
        cuda += f"; {device.client.platform_version}"
    print(f"CUDA: {cuda}")
    gpus = nvidia_gpus()
    print(f"NVIDIA GPUs on the machine: {', '.join(gpus) if gpus else 'none found'}")
    if not gpus or device.platform == "gpu":
        return []
    return [unused_gpu_problem(gpus, plugins)]


def unused_gpu_problem(gpus: list[str], plugins: dict[str, str]) -> str:
    """Why JAX runs on the CPU of a machine with an NVIDIA GPU, and what to do about it."""
    seen = f"this machine has an NVIDIA GPU ({gpus[0]}) but JAX runs on the CPU: "
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms and "cuda" not in platforms and "gpu" not in platforms:
        return seen + f"JAX_PLATFORMS={platforms} keeps it off the GPU; unset it"
    if not plugins:
        return seen + f"no CUDA build of JAX is installed; install one: {CUDA_INSTALL}"
    return (
        seen + f"{', '.join(plugins)} is installed but did not start (its warning is above); "
        "check the NVIDIA driver (nvidia-smi) and that the plugin's version equals jaxlib's, "
        f"then reinstall: {CUDA_INSTALL}"
    )


def nvidia_gpus() -> list[str]:
    """Names of the NVIDIA GPUs the driver reports (nvidia-smi, else /proc), without JAX."""
    if shutil.which("nvidia-smi"):
        try:
            listed = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            return [line.strip() for line in listed.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    gpus = Path("/proc/driver/nvidia/gpus")
    return [f"NVIDIA GPU at {entry.name}" for entry in sorted(gpus.glob("*"))]


def report_families() -> list[str]:
    """One line per family: built (and how long it took), not installed, or failed."""
    from fastpop.envs import MissingExtra

    print("environment families:")
    problems = []
    for family in families():
        if importlib.util.find_spec(family.package) is None:
            extra = f"pip install -e '.[{family.extra}]'" if family.extra else "reinstall fastpop"
            print(f"  {family.label:28s} not installed ({family.package}): {extra}")
            continue
        start = time.perf_counter()
        try:
            build(family.env_id)
        except MissingExtra as error:  # the family's own module is there, another is not
            print(f"  {family.label:28s} not installed: {error}")
            continue
        except Exception as error:  # any failure of an installed family is what we report
            failure = f"{type(error).__name__}: {error}"
            print(f"  {family.label:28s} FAILED building {family.env_id}: {failure}")
            problems.append(f"{family.label} is installed but {family.env_id} fails: {failure}")
            continue
        seconds = time.perf_counter() - start
        print(f"  {family.label:28s} ok ({family.env_id} built in {seconds:.1f} s)")
    return problems


def build(env_id: str) -> None:
    """Build `env_id` as a run would (process mode's env, or the device env and its reset)."""
    import jax

    from fastpop.envs import device_envs, make_env

    if device_envs.is_device_id(env_id):
        env = device_envs.make_device_env(env_id)
        jax.block_until_ready(env.reset(jax.random.key(0)))
        return
    make_env(env_id, seed=0).close()


def report_update(seconds: float) -> None:
    """TD3's update for SMOKE_POPULATION members on the default device, vectorized, timed."""
    import jax

    from fastpop.agents import make_agent, td3
    from fastpop.bench import levers
    from fastpop.bench.random_replay import BENCH_SPECS, random_replay
    from fastpop.bench.update import make_executor, time_executors
    from fastpop.population import broadcast_hparams, init_population

    agent = make_agent(td3.NAME, BENCH_SPECS[td3.NAME], **SMOKE_AGENT)
    key = jax.random.key(0)
    spec, buffers = random_replay(td3.NAME, SMOKE_POPULATION, key)
    executor, _ = make_executor(levers.parse("vectorized"), agent, spec, updates_per_call=10)
    hparams = broadcast_hparams(agent.default_hparams(), SMOKE_POPULATION)
    states = {"vectorized": init_population(agent, key, hparams)}
    executors = {"vectorized": executor}
    timing = time_executors(executors, states, buffers, hparams, seconds)["vectorized"]
    rate = SMOKE_POPULATION * 10 / timing["seconds_per_call"]
    print(
        f"update: {td3.NAME.upper()}, {SMOKE_POPULATION} members vectorized on "
        f"{jax.devices()[0].device_kind}: compiled in {timing['compile_seconds']:.1f} s, "
        f"{rate:,.0f} agent-updates/s over {timing['calls']} calls"
    )


def _memory_line(device) -> str:
    from fastpop.bench.common import available_host_bytes, total_memory_bytes

    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return f"{stats['bytes_limit'] / 2**30:.1f} GiB usable by JAX on {device.device_kind}"
    total, free = total_memory_bytes(), available_host_bytes()
    if total is None:
        return "host memory unknown"
    free_text = f", {free / 2**30:.1f} GiB available" if free is not None else ""
    return f"host {total / 2**30:.1f} GiB{free_text}"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"

"""A `--distributed` run trained twice over one fresh fastpop cache: what each process spent
compiling (or loading) its programs the first time and on the rerun.

Three processes x 1 forced CPU device train CEM-RL (a population of 3: the mean and a mirrored
pair) on gymnax's Pendulum for 256 env steps per member, as tests/test_distributed_cemrl.py
does; each prints every program with `--verbose` ("[compile ...] name: seconds", a cache load
included). The code measured is whatever `fastpop` PYTHONPATH gives, so an older commit
unpacked with `git archive` is measured the same way.

    python results/startup/distributed_rerun.py
    PYTHONPATH=/tmp/fastpop-before python results/startup/distributed_rerun.py

Prints a markdown table: per run, its wall seconds and each process's programs and seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastpop.distributed.flags import free_port

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "td3_gymnax_pendulum_cpu.yaml"
OVERRIDES = (
    "strategy=cemrl", "population.size=3", "population.devices=all", "cemrl.generation_steps=256",
    "agent.hidden_sizes=[16,16]", "agent.batch_size=32", "replay.samples_per_insert=4",
    "replay.min_size=128", "collect.warmup_steps=128", "collect.chunk_len=16",
    "train.updates_per_call=16", "eval.interval=256", "eval.episodes=2",
    "env.episode_length=100", "log.tensorboard=false", "train.total_env_steps=256",
    "replay.shared=true",
)  # fmt: skip
PROCESSES = 3
COMPILE = re.compile(r"\[compile +[\d.]+s\] .*: ([\d.]+)s$")


def train(workdir: Path, cache: Path) -> tuple[float, list[tuple[int, float]]]:
    """One run -> (wall seconds, each process's (programs, seconds compiling or loading))."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "FASTPOP_"))
    }
    env |= {"FASTPOP_CACHE_DIR": str(cache), "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    settings = [arg for override in OVERRIDES for arg in ("--set", override)]
    port, processes = free_port(), []
    start = time.perf_counter()
    for index in range(PROCESSES):
        command = [sys.executable, "-m", "fastpop", "train", str(CONFIG), "--out", "run"]
        command += [*settings, "--verbose", "--distributed", "--coordinator"]
        command += [f"127.0.0.1:{port}", "--num-processes", str(PROCESSES)]
        command += ["--process-id", str(index)]
        log = (workdir / f"process-{index}.txt").open("w")
        processes.append(subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=log))
    codes = [process.wait(timeout=600) for process in processes]
    wall = time.perf_counter() - start
    if codes != [0] * PROCESSES:
        sys.exit(f"the run failed ({codes}): see {workdir}")
    spent = []
    for index in range(PROCESSES):
        lines = (workdir / f"process-{index}.txt").read_text().splitlines()
        seconds = [float(m.group(1)) for line in lines if (m := COMPILE.search(line))]
        spent.append((len(seconds), sum(seconds)))
    return wall, spent


def main() -> None:
    cache = Path(tempfile.mkdtemp(prefix="fastpop-distributed-cache-"))
    print("| run | wall s | " + " | ".join(f"process {i}: programs, s" for i in range(PROCESSES)))
    print("| --- | --- | " + " | ".join("---" for _ in range(PROCESSES)))
    for name in ("first (cold cache)", "rerun"):
        workdir = Path(tempfile.mkdtemp(prefix="fastpop-distributed-run-"))
        wall, spent = train(workdir, cache)
        cells = " | ".join(f"{programs}, {seconds:.1f}" for programs, seconds in spent)
        print(f"| {name} | {wall:.1f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()

"""One collector's steps/s in two fastpop checkouts, in alternating rounds, against raw stepping.

On a shared, noisy machine a before/after comparison only means something when both are timed
close together: every round times raw gymnasium stepping (one env, random actions, one process,
as `fastpop bench pipeline` does), then one collector of each checkout acting for a population
(warm-up off, the learner only drains its ring), each in its own process, and each rate is
divided by the raw rate of its own round. Rates are given per wall-clock second (what the
pipeline benchmark reports) and per CPU second of the stepping process (the collector's own
utime + stime from /proc): on an oversubscribed machine the wall-clock rate mostly measures the
share of the cores a process got, the CPU-time rate what stepping through the collector costs.

    python results/bench/collection_rounds.py --before /path/to/old/checkout \
        --env HalfCheetah-v5 --pop 4 --rounds 5 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEASURE = """
import inspect, json, os, sys, time
from pathlib import Path
from fastpop import config as config_lib
from fastpop.envs import make_env

def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def raw(env_id, seconds):
    env = make_env(env_id, 0)
    env.reset(seed=0)
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        steps += 1
    return steps / (time.perf_counter() - start), steps / (time.process_time() - cpu)

def workers_input(config):
    # Workers take their ProcessParts since 0b4050d, the config before
    try:
        from fastpop.config.build import build_env_spec
        from fastpop.run.parts import process_parts
    except ImportError:
        return config
    return process_parts(config, build_env_spec(config))

def collect(env_id, pop, seconds):
    from fastpop.collect.workers import Workers
    config = config_lib.config_from_dict({
        "name": "collection_rounds", "algo": "td3", "env": {"id": env_id},
        "population": {"size": pop}, "collect": {"warmup_steps": 0, "num_collectors": 1},
        "log": {"tensorboard": False},
    })
    try:  # since the run's one front door (27fe65a)
        from fastpop.run.parts import build_learner
        learner = build_learner(config)
        workers = Workers(workers_input(config), learner.host_policy_tree(), learner.replay.spec)
    except ImportError:  # an older checkout
        from fastpop.learn.learner import Learner, prepare
        spec, agent = prepare(config)
        learner = Learner(config, spec, agent)
        new = "replay_spec" in inspect.signature(Workers).parameters  # before: the env spec
        workers = Workers(config, learner.policy_leaves(), learner.replay.spec if new else spec)
    with workers:
        pid, rows, start = workers.collectors[0].pid, 0, None
        while start is None or time.perf_counter() < start + seconds:
            workers.check()
            chunk = workers.next_chunk()[0]
            if chunk is None:
                time.sleep(0.0005)
            elif start is None:  # after start-up and compilation
                start, cpu = time.perf_counter(), cpu_seconds(pid)
            else:
                rows += chunk.reward.size
        wall, cpu = time.perf_counter() - start, cpu_seconds(pid) - cpu
    return rows / wall, rows / cpu

env_id, pop, seconds, what = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(json.dumps(raw(env_id, seconds) if what == "raw" else collect(env_id, pop, seconds)))
"""


def measure(tree: Path, env: str, pop: int, seconds: float, what: str) -> tuple[float, float]:
    """(steps per wall-clock second, steps per CPU second) in checkout `tree`."""
    environment = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, env, str(pop), str(seconds), what],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu = json.loads(result.stdout.strip().splitlines()[-1])
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the older checkout")
    parser.add_argument("--after", type=Path, default=REPO, help="default: this checkout")
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--pop", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rounds = []
    for index in range(args.rounds):
        raw_wall, raw_cpu = measure(args.after, args.env, args.pop, args.seconds, "raw")
        row = {"round": index, "raw_steps_per_s": raw_wall, "raw_steps_per_cpu_s": raw_cpu}
        for name in ("before", "after"):
            tree = getattr(args, name)
            wall, cpu = measure(tree, args.env, args.pop, args.seconds, "collect")
            row |= {f"{name}_steps_per_s": wall, f"{name}_vs_raw": wall / raw_wall}
            row |= {f"{name}_steps_per_cpu_s": cpu, f"{name}_cpu_vs_raw": cpu / raw_cpu}
        rounds.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        f"median_{name}{kind}_vs_raw": statistics.median(r[f"{name}{kind}_vs_raw"] for r in rounds)
        for name in ("before", "after")
        for kind in ("", "_cpu")
    }
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(
            json.dumps({"args": vars(args), "rounds": rounds, **summary}, indent=2, default=str)
            + "\n"
        )


if __name__ == "__main__":
    main()

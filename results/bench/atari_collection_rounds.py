"""One Atari collector on gymnasium's wrappers against ale_py's vector env, in alternating rounds.

`fastpop bench pipeline` runs TD3, which Atari's discrete actions refuse, so this script times
its collection part with DQN: one collector process (warm-up off, so the population's jitted
epsilon-greedy Nature CNN acts every step; the learner only drains the ring) with
`collect.atari_vector` false (gymnasium) and true (ale_py's AtariVectorEnv), and the same
with warm-up on for the whole measurement (uniform random actions, as in the first
`collect.warmup_steps` of a run: what the envs alone cost through a collector), next to raw
stepping as the pipeline benchmark defines it (one gymnasium env, random actions, one process)
and the collector's envs stepped alone with random actions (`lockstep_envs.lockstep_envs`). Every
measurement runs in its own process; a round times all of them back to back, and ratios are
taken within a round. Rates are env steps (= agent steps) per wall-clock second and per CPU
second of the stepping process (utime + stime, its threads included); the collectors also
report the seconds they spent stepping envs and in the policy.

    python results/bench/atari_collection_rounds.py --env ALE/Pong-v5 --pop 4 --rounds 3
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
KINDS = ("raw", "envs_gymnasium", "envs_vector", "collect_gymnasium", "collect_vector")
KINDS += ("warmup_gymnasium", "warmup_vector")
MEASURE = """
import json, os, sys, time
from pathlib import Path
from fastpop import config as config_lib

def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

def raw(env_id, seconds):
    from fastpop.envs import make_env
    env = make_env(env_id, 0)
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        steps += 1
    return {"wall": steps / (time.perf_counter() - start),
            "cpu": steps / (time.process_time() - cpu)}

def envs(env_id, count, seconds, vector):
    from fastpop.collect.lockstep_envs import lockstep_envs
    lockstep, stepped_by = lockstep_envs(env_id, count, 0, atari_vector=vector)
    lockstep.reset(0)
    steps, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        lockstep.step(lockstep.action_space.sample())
        steps += count
    return {"wall": steps / (time.perf_counter() - start),
            "cpu": steps / (time.process_time() - cpu), "envs": stepped_by}

def collect(env_id, pop, seconds, vector, warmup):
    from fastpop.bench.common import build_learner
    from fastpop.collect.workers import Workers
    config = config_lib.config_from_dict({
        "name": "atari_collection_rounds", "algo": "dqn", "env": {"id": env_id},
        "population": {"size": pop}, "replay": {"capacity": 10_000, "min_size": 1_000},
        "collect": {"warmup_steps": warmup, "num_collectors": 1, "atari_vector": vector},
        "eval": {"interval": 10_000_000}, "log": {"tensorboard": False},
    })
    learner = build_learner(config)
    # Workers take the published tree since stop 41, its leaves before.
    new = hasattr(learner, "host_policy_tree")
    policy = learner.host_policy_tree() if new else learner.policy_leaves()
    try:  # Workers take their ProcessParts since 0b4050d, the config before
        from fastpop.config.build import build_env_spec
        from fastpop.run.parts import process_parts
        given = process_parts(config, build_env_spec(config))
    except ImportError:
        given = config
    with Workers(given, policy, learner.replay.spec) as workers:
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
    return {"wall": rows / wall, "cpu": rows / cpu, "collector": workers.stats["collector 0"]}

env_id, pop, seconds, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if kind == "raw":
    result = raw(env_id, seconds)
elif kind.startswith("envs_"):
    result = envs(env_id, pop, seconds, kind == "envs_vector")
else:
    warmup = 10**9 if kind.startswith("warmup_") else 0
    result = collect(env_id, pop, seconds, kind.endswith("_vector"), warmup)
print(json.dumps(result, default=str))
"""


def measure(env: str, pop: int, seconds: float, kind: str) -> dict:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, env, str(pop), str(seconds), kind],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="ALE/Pong-v5")
    parser.add_argument("--pop", type=int, default=4, help="members = envs of the collector")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rounds = []
    for index in range(args.rounds):
        row: dict = {"round": index, "load_average": os.getloadavg()}
        for kind in KINDS:
            row[kind] = measure(args.env, args.pop, args.seconds, kind)
        for kind in KINDS[1:]:
            for unit in ("wall", "cpu"):
                row[f"{kind}_vs_raw_{unit}"] = row[kind][unit] / row["raw"][unit]
        rounds.append(row)
        print(json.dumps(row, default=str), flush=True)
    summary = {
        f"median_{kind}_vs_raw_{unit}": statistics.median(
            r[f"{kind}_vs_raw_{unit}"] for r in rounds
        )
        for kind in KINDS[1:]
        for unit in ("wall", "cpu")
    }
    print(json.dumps(summary))
    if args.out:
        document = {"args": vars(args), "rounds": rounds, **summary}
        args.out.write_text(json.dumps(document, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()

"""Env steps/s of one collector's gymnasium MuJoCo envs stepped one after another against the
same envs stepped by a pool of threads (MuJoCo releases the GIL inside mj_step; gymnasium's
Python around it does not). Random actions; alternating rounds.

    python results/startup/threaded_envs.py Humanoid-v5 5 1000
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env_id")
    parser.add_argument("envs", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    envs = [gym.make(args.env_id) for _ in range(args.envs)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)

    def step(index_and_action):
        index, action = index_and_action
        _, _, terminated, truncated, _ = envs[index].step(action)
        if terminated or truncated:
            envs[index].reset()

    for threads in (0, args.threads, 0, args.threads):
        actions = [envs[0].action_space.sample() for _ in envs]
        pool = ThreadPoolExecutor(threads) if threads else None
        start = time.perf_counter()
        for _ in range(args.steps):
            if pool is None:
                for pair in enumerate(actions):
                    step(pair)
            else:
                list(pool.map(step, enumerate(actions)))
        rate = args.envs * args.steps / (time.perf_counter() - start)
        print(f"{args.env_id} x{args.envs}, threads {threads}: {rate:,.0f} env steps/s")
        if pool is not None:
            pool.shutdown()


if __name__ == "__main__":
    main()

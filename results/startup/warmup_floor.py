"""The least time a preset's warm-up can take on one collector: its random env steps at the
speed of the collector's own stepping (gymnasium or ale_py envs in lockstep, random actions, rows
recorded as a collector records them), with nothing else running.

    python results/startup/warmup_floor.py

Prints, per process-mode preset whose first update waits for a warm-up of over 5,000 env steps,
the env steps that warm-up takes, the measured env steps per second and the seconds they need.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fastpop import config as config_lib
from fastpop.collect.lockstep_envs import lockstep_envs
from fastpop.collect.rows import RowLayout, RowStream
from fastpop.config.build import atari_options

ROOT = Path(__file__).resolve().parents[2]
PRESETS = (
    "td3_cemrl_hopper_cpu",
    "td3_pbt_halfcheetah_cpu",
    "sac_pbt_halfcheetah_cpu",
    "td3_dvd_humanoid_cpu",
    "dqn_pbt_pong_cpu",
)
SECONDS = 3.0  # of stepping per preset


def steps_per_second(config) -> float:
    slots = config.population.size * config.collect.envs_per_member
    envs, _ = lockstep_envs(config.env.id, slots, config.seed, atari=atari_options(config))
    obs = envs.reset(seed=config.seed)
    layout = RowLayout(config.collect.chunk_len, obs.shape[1:], obs.dtype, np.dtype("float32"), 1)
    stream, steps, start = RowStream(layout, slots), 0, time.perf_counter()
    while time.perf_counter() - start < SECONDS:
        actions = envs.action_space.sample()
        next_obs, reward, terminated, truncated = envs.step(actions)
        stream.append(obs, actions, reward, terminated, truncated)
        if stream.has_chunk():
            stream.pop_fields()
        obs, steps = next_obs, steps + slots
    envs.close()
    return steps / (time.perf_counter() - start)


def main() -> None:
    print("| preset | env | warm-up env steps | env steps/s (one process) | seconds |")
    print("| --- | --- | --- | --- | --- |")
    for name in PRESETS:
        config = config_lib.load_config(ROOT / "configs" / f"{name}.yaml")
        warmup = config.collect.warmup_steps * config.population.size
        rate = steps_per_second(config)
        print(f"| {name} | {config.env.id} | {warmup:,} | {rate:,.0f} | {warmup / rate:.1f} |")


if __name__ == "__main__":
    main()

"""Pipeline benchmark: is collection hidden behind learning?

1. Collection: env steps/s of N collector processes acting with a population's batched policy
   (the learner only drains their chunks), against gymnasium's raw step rate in one process.
2. Learner utilisation: a real training run's agent-updates/s once learning runs, against the
   update-step benchmark at the same population size, measured in the same command.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fastpop import config as config_lib
from fastpop.bench.common import build_learner, device_label, write_json


def raw_step_rate(env_id: str, seconds: float, seed: int = 0) -> float:
    """gymnasium env steps/s of one env with random actions, one process, no policy."""
    from fastpop.envs import make_env

    env = make_env(env_id, seed)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
        steps += 1
    env.close()
    return steps / (time.perf_counter() - start)


def collection_rate(config: config_lib.Config, seconds: float) -> float:
    """Env steps/s of the config's collectors acting with the policy (warm-up disabled)."""
    from fastpop.collect.workers import Workers

    learner = build_learner(config)
    with Workers(config, learner.host_policy_tree(), learner.replay.spec) as workers:
        rows = 0
        deadline = None
        while deadline is None or time.perf_counter() < deadline:
            workers.check()
            chunk = workers.next_chunk()[0]
            if chunk is None:
                time.sleep(0.0005)
                continue
            if deadline is None:  # start timing after start-up and compilation
                deadline, start = time.perf_counter() + seconds, time.perf_counter()
                continue
            rows += chunk.reward.size
        elapsed = time.perf_counter() - start
    return rows / elapsed


def bench_pipeline(
    env_id: str,
    population_size: int,
    collectors: list[int],
    seconds: float,
    train_seconds: float,
    train_collectors: int = 1,
    warmup_steps: int = 5_000,
    agent: dict | None = None,
    on_part=None,
) -> dict:
    """Collection with each count of `collectors`, then a training run of `train_seconds` fed
    by `train_collectors` collectors: its learner's utilisation (agent-updates/s against the
    update benchmark's at the same population) and the share of its learning time the run loop
    spent idle, waiting for rows. Learning starts after `warmup_steps` env steps per member.
    `agent`: the agent's config fields for both the run and the update benchmark (None: the
    algorithm's defaults). `on_part(result)`: called with the result so far after each
    collection measurement (a caller under a time cap keeps them)."""
    from fastpop.bench.update import UpdateBenchSettings, bench_update
    from fastpop.envs import env_spec

    algo = "dqn" if env_spec(env_id).discrete else "td3"  # Atari ids: DQN's Nature CNN
    base = {
        "name": "bench_pipeline",
        "algo": algo,
        "env": {"id": env_id},
        "population": {"size": population_size},
        "collect": {"warmup_steps": 0, "num_collectors": 1},
        "agent": dict(agent or {}),
        "log": {"tensorboard": False, "progress_interval_seconds": 30.0},
    }
    result: dict = {"env": env_id, "population": population_size, "device": device_label()}
    result["agent_overrides"] = dict(agent or {})
    result["raw_gymnasium_steps_per_s"] = raw_step_rate(env_id, seconds)
    result["collection"] = []
    for count in collectors:
        config = config_lib.config_from_dict(
            {**base, "collect": {"warmup_steps": 0, "num_collectors": count}}
        )
        rate = collection_rate(config, seconds)
        result["collection"].append(
            {
                "collectors": count,
                "env_steps_per_s": rate,
                "per_collector_vs_raw": rate / count / result["raw_gymnasium_steps_per_s"],
            }
        )
        print(
            f"collection: {count} collector(s) {rate:,.0f} env steps/s "
            f"({rate / count / result['raw_gymnasium_steps_per_s']:.2f}x raw per collector)"
        )
        if on_part is not None:
            on_part(result)
    # Only the rate is read here: no anatomy (one more compile on a CPU) and a small
    # reference matmul.
    settings = UpdateBenchSettings(
        algo, min_seconds=seconds, matmul_size=256, agent=agent, anatomy_from=population_size + 1
    )
    update = bench_update(settings, [population_size], ["vectorized"], log=lambda line: None)
    training = {"seconds": train_seconds, "collectors": train_collectors, "warmup": warmup_steps}
    result["learner"] = learner_utilisation(
        base, update["rows"][0]["agent_updates_per_s"], **training
    )
    return result


def learner_utilisation(
    base: dict, update_rate: float, seconds: float, collectors: int, warmup: int
) -> dict:
    """A training run of config `base` for `seconds`, fed by `collectors` collectors: its
    agent-updates/s once learning runs against `update_rate` (the update benchmark's)."""
    from fastpop.run.loop import Run
    from fastpop.run.parts import build_run
    from fastpop.run.progress import samples_per_insert_line

    config = config_lib.config_from_dict(
        {
            **base,
            "collect": {"warmup_steps": warmup, "num_collectors": collectors},
            "replay": {"min_size": warmup},
            "train": {"total_env_steps": 10_000_000, "max_wall_seconds": seconds},
            "eval": {"interval": 10_000_000},
        }
    )
    with tempfile.TemporaryDirectory() as run_dir:
        run = Run(build_run(config), Path(run_dir), log=lambda line: None)
        summary = run.run()
    if summary["learning_started_at"] is None:
        raise ValueError(
            f"the training run never updated in {seconds:g} s ({warmup} warm-up steps per "
            "member): give it more seconds or fewer warm-up steps"
        )
    learning_seconds = summary["wall_time"] - summary["learning_started_at"]
    seconds = summary["learner_seconds"]
    updating = seconds.get("update_dispatch", 0.0) + seconds.get("update_wait", 0.0)
    run_rate = summary["updates_per_member"] * config.population.size / learning_seconds
    print(
        f"learner: {run_rate:,.0f} agent-updates/s in the run vs {update_rate:,.0f} in the "
        f"update benchmark ({run_rate / update_rate:.2f}x); {samples_per_insert_line(summary)}"
    )
    return {
        "collectors": collectors,
        "update_benchmark_agent_updates_per_s": update_rate,
        "run_agent_updates_per_s": run_rate,
        "utilisation": run_rate / update_rate,
        "train_seconds": summary["wall_time"],
        "learning_seconds": learning_seconds,
        "samples_per_insert_target": summary["samples_per_insert_target"],
        "samples_per_insert_achieved": summary["samples_per_insert_achieved"],
        # an upper bound of the idle share after learning began: the loop's idle seconds
        # include those of the warm-up before it
        "idle_fraction_of_learning": seconds.get("idle", 0.0) / learning_seconds,
        # the host's share in the updates: dispatching them and waiting for the device (with
        # one update in flight while the host publishes, the device computes for longer)
        "update_fraction_of_learning": updating / learning_seconds,
        # what no phase of the loop covered (the breakdown's `other`)
        "unaccounted_fraction_of_learning": seconds["other"] / learning_seconds,
        "time_breakdown": {
            "learner_seconds": summary["learner_seconds"],
            "workers": summary["workers"],
        },
    }


def write_pipeline_results(result: dict, out_dir: Path) -> Path:
    env = result["env"].replace("/", "_")
    return write_json(result, out_dir / f"pipeline_{env}_{result['device']}.json")

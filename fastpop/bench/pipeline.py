"""Pipeline benchmark: is collection hidden behind learning?

1. Collection: env steps/s of N collector processes acting with a population's batched policy
   (the learner only drains their chunks), against gymnasium's raw step rate in one process.
2. Learner utilisation: in a real training run's learning window (its first update to its
   loop's end, less the evaluations and checkpoints taken in it), the share the learner spent
   busy updating, the share it waited for rows (bound by its rows, or by its update), and its
   agent-updates/s against the update-step benchmark at the run's population, K, batch size and
   replay rows per member, measured in the same command.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fastpop import config as config_lib
from fastpop.agents import registry
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
    from fastpop.config.build import build_env_spec
    from fastpop.run.parts import process_parts

    learner = build_learner(config)
    processes = process_parts(config, build_env_spec(config))
    with Workers(processes, learner.host_policy_tree(), learner.replay.spec) as workers:
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
    train_env_steps: int | None = None,
) -> dict:
    """Collection with each count of `collectors`, then a training run of `train_seconds` (or
    `train_env_steps` per member, where given, whichever ends first) fed by `train_collectors`
    collectors: its learner's utilisation (`utilisation_from_summary`:
    busy and waiting for rows in its learning window, agent-updates/s against the update
    benchmark's at the run's settings). Learning starts after `warmup_steps` env steps per
    member.
    `agent`: the agent's config fields for both the run and the update benchmark (None: the
    algorithm's defaults). `on_part(result)`: called with the result so far after each
    collection measurement (a caller under a time cap keeps them)."""
    from fastpop.bench.update import bench_update
    from fastpop.envs import env_spec

    # the configs' algorithm of the env's action kind (Atari ids: DQN's Nature CNN)
    algo = registry.default_for("discrete" if env_spec(env_id).discrete else "continuous")
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
    training = training_config(base, train_seconds, train_collectors, warmup_steps, train_env_steps)
    settings = benchmark_settings(training, seconds)
    update = bench_update(settings, [population_size], ["vectorized"], log=lambda line: None)
    result["learner"] = learner_utilisation(
        training, update["rows"][0]["agent_updates_per_s"], settings
    )
    return result


def training_config(
    base: dict, seconds: float, collectors: int, warmup: int, env_steps: int | None = None
) -> config_lib.Config:
    """The training run of config `base` for `seconds` (or `env_steps` per member, where given:
    a run that must update, however busy the machine), fed by `collectors` collectors, learning
    after `warmup` env steps per member. No evaluation before its final one, no checkpoint
    before its stop's, and that one without the replay: none is what is measured."""
    return config_lib.config_from_dict(
        {
            **base,
            "collect": {"warmup_steps": warmup, "num_collectors": collectors},
            "replay": {"min_size": warmup},
            "train": {"total_env_steps": env_steps or 10_000_000, "max_wall_seconds": seconds},
            "eval": {"interval": 10_000_000, "episodes": 1},
            "checkpoint": {"interval_seconds": None, "replay": False},
        }
    )


def benchmark_settings(config: config_lib.Config, seconds: float):
    """The update benchmark's settings like the run of `config`: its K (train.updates_per_call),
    batch size, agent and per-member replay rows (replay.capacity: one member's buffer; a shared
    one is benchmarked as per-member buffers of that size), timed for `seconds`. Only the rate is
    read: no anatomy (one more compile on a CPU) and a small reference matmul."""
    from fastpop.bench.update import UpdateBenchSettings

    return UpdateBenchSettings(
        config.algo,
        updates_per_call=config.train.updates_per_call,
        batch_size=config.agent["batch_size"],
        min_seconds=seconds,
        matmul_size=256,
        agent=dict(config.agent),
        anatomy_from=config.population.size + 1,
        replay_rows=config.replay.capacity,
    )


def learner_utilisation(config: config_lib.Config, update_rate: float, settings) -> dict:
    """The training run of `config` (`training_config`'s): its learner's utilisation
    (`utilisation_from_summary`) against `update_rate`, the update benchmark's at `settings`."""
    from fastpop.run.loop import Run
    from fastpop.run.parts import build_run

    with tempfile.TemporaryDirectory() as run_dir:
        run = Run(build_run(config), Path(run_dir), log=lambda line: None)
        summary = run.run()
    if summary["learning_window"] is None:
        raise ValueError(
            f"the training run never updated in {config.train.max_wall_seconds:g} s "
            f"({config.collect.warmup_steps} warm-up steps per member): give it more seconds or "
            "fewer warm-up steps"
        )
    learner = utilisation_from_summary(summary, config, update_rate)
    learner["benchmark"] = {
        "updates_per_call": settings.updates_per_call,
        "batch_size": settings.batch_size,
        "replay_rows": settings.replay_rows,
        "population": config.population.size,
    }
    print(utilisation_line(learner, summary))
    return learner


# The run is bound by its rows when the learner waited for them (the loop idle: no rows to move,
# no update the rate limiter allows) for more than this share of its learning window (more than
# the learner's target, busy >= 90% of it, leaves for everything else) AND its rate fell below
# RATE_KEPT of the like-for-like benchmark row's: the loop also idles while an update it
# dispatched computes, so a wait that cost no updates binds nothing (the H200's run of
# 2026-11-28 idled 16% of its window at 1.01x the benchmark's rate).
ROWS_BOUND_FRACTION = 0.10
RATE_KEPT = 0.85


def bound_by(waiting_fraction: float, rate_vs_benchmark: float) -> str:
    """ "rows" or "update": what kept the learner from more updates (see ROWS_BOUND_FRACTION)."""
    starved = waiting_fraction > ROWS_BOUND_FRACTION and rate_vs_benchmark < RATE_KEPT
    return "rows" if starved else "update"


# The loop's timers of an evaluation round (snapshot, results, the strategy's step on them)
EVALUATION_TIMERS = ("evaluation_snapshots", "evaluation_results", "strategies")


def evaluation_seconds(seconds: dict) -> float:
    """The seconds of the evaluation rounds taken in a window (its seconds per phase). The
    results' timer also counts the loop's poll for them, made on every pass: where the window
    took no snapshot, those seconds are the loop's own and stay in it."""
    if not seconds.get("evaluation_snapshots", 0.0):
        return seconds.get("strategies", 0.0)
    return sum(seconds.get(name, 0.0) for name in EVALUATION_TIMERS)


def utilisation_from_summary(summary: dict, config: config_lib.Config, update_rate: float) -> dict:
    """The learner's utilisation in a run's learning window (summary["learning_window"]: from
    its first update to the loop's end; the final evaluation, the stop's checkpoint and the
    workers' stop after it are not in it), less the evaluation rounds and checkpoints taken in
    it (reported apart, as fractions of the learning time they were taken from): busy is the
    updates' dispatch and the waits for them (`update_dispatch` + `update_wait`); waiting for
    rows is the loop's `idle`. Its agent-updates/s over that window against `update_rate` (the
    update benchmark's, at the run's settings: `benchmark_settings`)."""
    window = summary["learning_window"]
    seconds = window["seconds"]
    learning = window["ended_at"] - window["started_at"]
    evaluation = evaluation_seconds(seconds)
    checkpoint = seconds.get("checkpoints", 0.0)
    window_seconds = learning - evaluation - checkpoint
    busy = seconds.get("update_dispatch", 0.0) + seconds.get("update_wait", 0.0)
    waiting = seconds.get("idle", 0.0)
    run_rate = window["updates_per_member"] * config.population.size / window_seconds
    waiting_fraction = waiting / window_seconds
    return {
        "collectors": config.collect.num_collectors,
        "window_seconds": window_seconds,
        "learning_seconds": learning,  # the window with its evaluations and checkpoints
        "evaluation_seconds": evaluation,
        "evaluation_fraction_of_learning": evaluation / learning,
        "checkpoint_seconds": checkpoint,
        "checkpoint_fraction_of_learning": checkpoint / learning,
        # the final evaluation, the stop's checkpoint and the workers' stop
        "after_window_seconds": summary["wall_time"] - window["ended_at"],
        "busy_seconds": busy,
        "busy_fraction_of_window": busy / window_seconds,
        "waiting_for_rows_seconds": waiting,
        "waiting_for_rows_fraction": waiting_fraction,
        "bound_by": bound_by(waiting_fraction, run_rate / update_rate),
        "rows_bound_above": ROWS_BOUND_FRACTION,
        "run_agent_updates_per_s": run_rate,
        "update_benchmark_agent_updates_per_s": update_rate,
        "rate_vs_benchmark": run_rate / update_rate,
        "train_seconds": summary["wall_time"],
        "samples_per_insert_target": summary["samples_per_insert_target"],
        "samples_per_insert_achieved": summary["samples_per_insert_achieved"],
        "time_breakdown": {
            "learning_window": seconds,
            "learner_seconds": summary["learner_seconds"],
            "workers": summary["workers"],
        },
    }


def utilisation_line(learner: dict, summary: dict) -> str:
    """The console's line of `learner_utilisation`'s result."""
    from fastpop.run.progress import samples_per_insert_line

    bench = learner["benchmark"]
    return (
        f"learner: busy {learner['busy_fraction_of_window']:.0%} of its "
        f"{learner['window_seconds']:.1f} s learning window (apart: evaluations "
        f"{learner['evaluation_seconds']:.1f} s, checkpoints {learner['checkpoint_seconds']:.1f} "
        f"s); waiting for rows {learner['waiting_for_rows_fraction']:.0%} of it: bound by its "
        f"{learner['bound_by']}; {learner['run_agent_updates_per_s']:,.0f} agent-updates/s vs "
        f"{learner['update_benchmark_agent_updates_per_s']:,.0f} in the update benchmark at "
        f"K={bench['updates_per_call']}, batch {bench['batch_size']}, "
        f"{bench['replay_rows']:,} rows per member ({learner['rate_vs_benchmark']:.2f}x); "
        f"{samples_per_insert_line(summary)}"
    )


def write_pipeline_results(result: dict, out_dir: Path) -> Path:
    env = result["env"].replace("/", "_")
    return write_json(result, out_dir / f"pipeline_{env}_{result['device']}.json")

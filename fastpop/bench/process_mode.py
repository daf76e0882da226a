"""The process-mode row of `fastpop bench device`: the brax environment's MuJoCo counterpart
(gymnasium, e.g. brax/halfcheetah -> HalfCheetah-v5) trained as `fastpop train` trains it in
process mode, at the same population size, envs per member, chunk length, networks and update
ratio as the device-mode row beside it.

A brax id runs in device mode only (collector processes stepping brax are refused), so the
nearest process-mode experiment is the same task on MuJoCo, stepped by collector processes.
The simulators differ (brax's pipelines are not MuJoCo), so the two rows compare the trainers'
throughput on one task at one set of shapes, not one physics.

The learner is fed as the run loop feeds it (chunks in while the rate limiter allows, one update
call when it allows, the policies of the call before it published while it runs:
fastpop.run.update_pipeline), without evaluations or metrics; a timed
round runs from just after one insert to just after another, as the device rows' do. Collector
processes run beside the learner, so these rounds cannot alternate with the device-mode rounds
(the collectors would fill their rings during them): they follow them.
"""

from __future__ import annotations

import time

import jax

from fastpop import config as config_lib
from fastpop.bench.common import DeviceBenchSettings, build_learner

DEFAULT_COLLECTORS = 2  # the config's default, capped by the number of env lanes
WARM_UP_SECONDS = 600  # collectors' start-up and the update's compile, bounded


def process_config(settings: DeviceBenchSettings, size: int, per_member: int) -> config_lib.Config:
    """The process-mode config of one (P, E) on `settings.process_env` (a gymnasium id, and
    `settings.updates_per_call` resolved): one update per env step and member, learning from
    the first chunk, no warm-up steps, no evaluations."""
    from fastpop.config.build import build_agent, build_env_spec

    chunk_len, updates = settings.chunk_len, settings.updates_per_call
    env = {"id": settings.process_env}
    data = {"name": "bench_device_process", "algo": settings.algo, "env": env}
    data["agent"] = settings.agent or {}
    probe = config_lib.config_from_dict(data)
    batch = build_agent(probe, build_env_spec(probe)).batch_size
    capacity = 100_000 - 100_000 % per_member
    data["replay"] = {
        "capacity": capacity,
        "min_size": chunk_len * per_member,
        "samples_per_insert": float(batch),
    }
    collectors = min(DEFAULT_COLLECTORS, size * per_member)
    data["collect"] = {"mode": "processes", "envs_per_member": per_member, "chunk_len": chunk_len}
    data["collect"] |= {"num_collectors": collectors, "warmup_steps": 0}
    data |= {"population": {"size": size}, "train": {"updates_per_call": updates}}
    data["log"] = {"tensorboard": False}
    return config_lib.config_from_dict(data)


class RunLoopPasses:
    """A Learner fed by open collector processes, as the run loop feeds it."""

    def __init__(self, learner, workers):
        self.learner, self.workers = learner, workers
        self.latest = None  # the newest update call's `PolicyCopy`

    def warm_up(self) -> float:
        """Seconds until the second update call is done (the first compiled)."""
        start = time.perf_counter()
        while self.learner.updates < 2:
            if time.perf_counter() - start > WARM_UP_SECONDS:
                raise TimeoutError(f"process mode: no update within {WARM_UP_SECONDS} s")
            self.one_pass()
        jax.block_until_ready(self.learner.states)
        return time.perf_counter() - start

    def one_pass(self) -> bool:
        """One pass of the run loop; whether a chunk went in."""
        learner, workers = self.learner, self.workers
        workers.check()
        moved = False
        while learner.limiter.can_insert() and workers.feed(learner) is not None:
            moved = True
        if learner.can_update():
            previous = self.latest  # of the states this call starts from (and donates)
            learner.update()
            self.latest = learner.policy_copy()
            self._publish(previous)  # while this call runs
        elif self.latest is not None and self.latest.ready():
            self._publish(self.latest)
        elif not moved:
            time.sleep(0.0005)
        return moved

    def _publish(self, copy) -> None:
        if copy is not None and copy.version != self.workers.published_version:
            self.workers.publish_from(self.learner, copy)

    def until_insert(self) -> None:
        while not self.one_pass():
            pass

    def round(self, seconds: float) -> dict:
        """From just after one insert to just after another, at least `seconds` apart: whole
        cycles of rows and the updates they allow (one chunk may take longer than `seconds`
        to learn from). The clock stops once the states are ready."""
        learner, limiter = self.learner, self.learner.limiter
        self.until_insert()
        inserted, updates = limiter.inserted, learner.updates
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.one_pass()
        self.until_insert()
        jax.block_until_ready(learner.states)
        size = learner.size
        return {
            "seconds": time.perf_counter() - start,
            "env_steps": (limiter.inserted - inserted) * size,
            "agent_updates": (learner.updates - updates) * size,
        }


def measure_process_mode(config: config_lib.Config, rounds: int, seconds: float, rates) -> dict:
    """`rounds` rounds of `seconds / rounds` each after the warm-up; `rates` turns them into
    medians (the device rows' `rates`)."""
    from fastpop.collect.workers import Workers
    from fastpop.config.build import build_env_spec
    from fastpop.run.parts import process_parts

    learner = build_learner(config)
    policy, spec = learner.host_policy_tree(), learner.replay.spec
    processes = process_parts(config, build_env_spec(config))
    with Workers(processes, policy, spec, log=lambda line: None) as workers:
        passes = RunLoopPasses(learner, workers)
        warm_up = passes.warm_up()
        measured = [passes.round(seconds / rounds) for _ in range(rounds)]
    return {
        "env": config.env.id,
        "collectors": config.collect.num_collectors,
        "warm_up_seconds": warm_up,
    } | rates(measured)

"""The worker processes of fastpop.collect.workers: the collectors and the evaluator started,
watched, restarted up to collect.max_restarts and stopped. Each sends to the learner over a pipe
of its own: its stats, its error, and the evaluator its results."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from fastpop.collect.collector import AgentRecipe, CollectorEnvs, CollectorSpec, run_collector
from fastpop.collect.evaluator import EvaluatorSpec, run_evaluator
from fastpop.collect.rows import RowLayout
from fastpop.collect.spawning import starting_worker
from fastpop.collect.worker_channels import WorkerChannels
from fastpop.types import EnvSpec

if TYPE_CHECKING:  # the learner's side never imports the config package for its sections
    from fastpop.config.sections import CollectConfig

STOP_TIMEOUT_SECONDS = 3.0


class WorkerFailed(RuntimeError):
    """A worker process died more often than collect.max_restarts allows."""


def received(connection) -> list:
    """The messages waiting on a worker's pipe, without blocking; what a dead worker sent
    before it died is still read, then nothing (no error)."""
    messages = []
    try:
        while connection.poll():
            messages.append(connection.recv())
    except (EOFError, OSError):  # the worker is gone and its end of the pipe with it
        pass
    return messages


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class ProcessParts(NamedTuple):
    """What process mode's workers are made of (`RunParts.processes`, fastpop.run.parts, made
    once; a distributed process's, of its own members: fastpop.distributed.multihost). Spawned
    collectors and evaluators receive no agent and no `Config`: they rebuild the agent from its
    `AgentRecipe`, plain data."""

    collect: CollectConfig
    population_size: int
    seed: int
    agent: AgentRecipe  # which numpy policy a collector acts with, or what it rebuilds
    collector_envs: CollectorEnvs  # what a collector reads before its warm-up ends
    eval_episodes: int

    @property
    def env_spec(self) -> EnvSpec:
        """The learner's env spec (its agent's)."""
        return self.agent.env_spec


class WorkerLaunch(NamedTuple):
    """What every worker process is started from. What crosses to a collector is plain data,
    so that unpickling it imports no JAX."""

    context: Any  # multiprocessing's "spawn" context
    parts: ProcessParts
    row_layout: RowLayout
    blocks: list[tuple[int, int]]  # each collector's (first_slot, num_slots)
    numpy_policies: list  # how each collector acts once its warm-up ends (acting.numpy_policy_for)
    evaluator_policy: Any  # how the evaluator acts: a NumpyPolicy, or None (the jitted `act`)
    published_hparams: dict  # the publishes' hparams, as collector.hparams_layout
    # Resumes of the run so far: a resumed run's collectors draw new environment seeds instead
    # of replaying the first episodes of the run.
    generation: int

    def collector_spec(self, index: int, restarts: int, channels: WorkerChannels) -> CollectorSpec:
        first, count = self.blocks[index]
        entropy = [self.parts.seed, first, restarts]
        entropy += [self.generation] if self.generation else []
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0] % 2**31)
        return CollectorSpec(
            index,
            self.parts.agent,
            self.published_hparams,
            self.parts.collector_envs,
            first,
            count,
            self.row_layout,
            channels.params.spec,
            channels.rings[index].spec,
            channels.stop_flag.spec,
            seed,
            mp.current_process().pid,
            self.numpy_policies[index],
        )

    def evaluator_spec(self, restarts: int, channels: WorkerChannels) -> EvaluatorSpec:
        parts = self.parts
        return EvaluatorSpec(
            parts.agent,
            self.published_hparams,
            parts.collector_envs.env_id,
            parts.collector_envs.atari,
            parts.eval_episodes,
            channels.eval_ring.spec,
            channels.stop_flag.spec,
            parts.seed + 10_000 * restarts,
            mp.current_process().pid,
            self.evaluator_policy,
        )


class WorkerProcesses:
    """The collector processes, one per block of env slots, and the evaluator process (started
    by the caller when it is wanted), over `channels`."""

    def __init__(self, launch: WorkerLaunch, channels: WorkerChannels, log, log_event):
        self.launch, self.channels = launch, channels
        self.log, self.log_event = log, log_event
        count = len(launch.blocks)
        self.collectors: list = [None] * count
        self.status = [None] * count  # the receiving end of each collector's pipe
        self.restarts = [0] * count
        self.evaluator = None
        self.results = None  # the receiving end of the evaluator's pipe
        self.result_backlog: list = []  # what a dead evaluator sent before its restart
        self.evaluator_restarts = 0
        self.stats: dict[str, dict] = {}
        self.stopped = False

    def start_collector(self, index: int) -> None:
        spec = self.launch.collector_spec(index, self.restarts[index], self.channels)
        receive, send = self.launch.context.Pipe(duplex=False)
        process = self.launch.context.Process(
            target=run_collector,
            name=f"fastpop-collector-{index}",
            args=(spec, send),
            daemon=True,
        )
        with starting_worker():
            process.start()
        send.close()  # the worker's end: when it dies, reading here ends instead of blocking
        if self.status[index] is not None:
            self.status[index].close()  # drained by `check` before every restart
        self.collectors[index] = process
        self.status[index] = receive

    def start_evaluator(self) -> None:
        spec = self.launch.evaluator_spec(self.evaluator_restarts, self.channels)
        receive, send = self.launch.context.Pipe(duplex=False)
        self.evaluator = self.launch.context.Process(
            target=run_evaluator,
            name="fastpop-evaluator",
            args=(spec, send),
            daemon=True,
        )
        with starting_worker():
            self.evaluator.start()
        send.close()
        if self.results is not None:
            self.result_backlog += received(self.results)
            self.results.close()
        self.results = receive

    def evaluator_results(self, timeout: float) -> list[dict]:
        """The evaluator's results that arrived, after waiting up to `timeout` s for the first;
        raises if it reported an error."""
        if timeout and not self.result_backlog:
            self.results.poll(timeout)
        messages, self.result_backlog = [*self.result_backlog, *received(self.results)], []
        results = []
        for kind, *payload in messages:
            if kind == "error":
                self._failed("evaluator", payload[1])
            results.append(payload[0])
        return results

    def check(self) -> None:
        """Notices dead workers: restarts them up to collect.max_restarts, else raises."""
        reasons = self._drain_status()
        for index, process in enumerate(self.collectors):
            if process.exitcode is not None:
                reason = reasons.get(index) or describe_exit(process.exitcode)
                self.restarts[index] += 1
                self._restart_or_fail(
                    f"collector {index}",
                    self.restarts[index],
                    reason,
                    lambda i=index: self.start_collector(i),
                )
        if self.evaluator is not None and self.evaluator.exitcode is not None:
            self.evaluator_restarts += 1
            reason = reasons.get(-1) or describe_exit(self.evaluator.exitcode)
            self._restart_or_fail(
                "evaluator", self.evaluator_restarts, reason, self.start_evaluator
            )

    def _drain_status(self) -> dict[int, str]:
        reasons = {}
        for connection in self.status:
            for kind, index, payload in received(connection) if connection else ():
                if kind == "error":
                    reasons[index] = payload.strip().splitlines()[-1]
                    self.log(f"worker {index} failed:\n{payload}")
                else:
                    self.stats[f"collector {index}"] = payload
        return reasons

    def _restart_or_fail(self, name: str, count: int, reason: str, start) -> None:
        max_restarts = self.launch.parts.collect.max_restarts
        if count > max_restarts:
            raise WorkerFailed(
                f"{name} died ({reason}) and was already restarted "
                f"{count - 1} times (collect.max_restarts)"
            )
        self.log(f"{name} died ({reason}); restarting it ({count}/{max_restarts})")
        self.log_event("worker_restart", {"worker": name, "reason": reason, "restart": count})
        start()

    def _failed(self, name: str, traceback_text: str) -> None:
        raise WorkerFailed(f"{name} failed: {traceback_text.strip().splitlines()[-1]}")

    def stop(self) -> dict[str, dict]:
        """Stops every process (politely, then by force) and returns their reported stats."""
        if self.stopped:
            return self.stats
        self.stopped = True
        if self.channels.stop_flag is not None:
            self.channels.stop_flag.set()
        processes = [p for p in (*self.collectors, self.evaluator) if p is not None]
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(1.0)
            if process.is_alive():
                process.kill()
                process.join(1.0)
        self._drain_status()
        for connection in (*self.status, self.results):
            if connection is not None:
                connection.close()
        return self.stats

"""The learner's side of the worker processes: start, feed, watch, restart and stop them.

Everything between the learner and its workers is shared memory (`shm`) or a pipe per worker:
no `multiprocessing` Event, Queue or Lock, whose named semaphores would outlive a run killed as
a whole in /dev/shm. Shared-memory segments such a run leaves are reclaimed at the next start.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections import deque

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.collect.acting import numpy_policy_for
from fastpop.collect.collector import (
    TRIAL_FIELD,
    CollectorEnvs,
    CollectorSpec,
    max_episodes_per_chunk,
    run_collector,
)
from fastpop.collect.evaluator import EvaluatorSpec, run_evaluator
from fastpop.collect.rows import RowLayout
from fastpop.collect.segments import memory_order_problem, reclaim_orphaned_segments
from fastpop.collect.shm import ChunkRing, ParamChannel, StopFlag
from fastpop.collect.spawning import starting_worker
from fastpop.config.build import build_env_spec
from fastpop.population import replay

EVAL_SLOTS = 4
STOP_TIMEOUT_SECONDS = 3.0


class WorkerFailed(RuntimeError):
    """A worker process died more often than collect.max_restarts allows."""


def split_slots(num_envs: int, num_collectors: int) -> list[tuple[int, int]]:
    """Contiguous (first_slot, num_slots) blocks, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_collectors)
    blocks, first = [], 0
    for index in range(num_collectors):
        count = base + (index < extra)
        blocks.append((first, count))
        first += count
    return blocks


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


class Workers:
    """Collectors, the evaluator and their shared memory, as one context manager.

    Leaving the context (normally, on an exception or on Ctrl-C) stops every process within a
    few seconds and unlinks every shared-memory segment.
    """

    chunks_per_pass = None  # the loop drains every chunk that is ready

    def __init__(
        self,
        config,
        initial_policy,
        replay_spec,
        log=print,
        log_event=None,
        generation: int = 0,
        policy_version: int | None = 0,
        evaluator_with_first_rows: bool = True,
    ):
        """`initial_policy`: what the collectors act with first, as host arrays
        (`Learner.host_policy_tree`: stacked policy params, hparams, env steps per member).
        `replay_spec`: the learner's (`Learner.replay.spec`); collectors build their chunks
        with it rather than deriving their own. `policy_version`: the learner's
        `policy_version` when `initial_policy` was taken (see `publish_if_changed`); None:
        it is zeros of the policies' layout, not published (collectors started before the
        learner exists step their warm-up, then wait for `publish_from`).
        `evaluator_with_first_rows`: start the evaluator once every collector has sent rows (a
        strategy that pauses for its evaluations); False: with the first trained policies, so
        that it takes no CPU from the warm-up and the first update."""
        if (problem := memory_order_problem()) is not None:
            raise WorkerFailed(problem)
        self.config = config
        # Resumes of the run so far: a resumed run's collectors draw new environment seeds
        # instead of replaying the first episodes of the run.
        self.generation = generation
        self.log = log
        self.log_event = log_event or (lambda kind, payload: None)
        self.context = mp.get_context("spawn")
        self.initial_leaves = jax.tree.leaves(initial_policy)
        self.published_version = policy_version
        self.config_dict = config_lib.config_to_dict(config)
        self.replay_spec = replay_spec
        # What collectors are sent: plain data, so unpickling it imports no JAX.
        self.collector_envs = CollectorEnvs.of(config)
        self.row_layout = RowLayout.of(replay_spec)
        num_envs = config.population.size * config.collect.envs_per_member
        self.blocks = split_slots(num_envs, config.collect.num_collectors)
        # How each collector acts once its warm-up ends: in numpy where it can (it then never
        # imports JAX), else with the agent's jitted `act`.
        env_spec, envs_per_member = build_env_spec(config), config.collect.envs_per_member
        self.numpy_policies = [
            numpy_policy_for(config.algo, env_spec, initial_policy, count, envs_per_member)
            for _, count in self.blocks
        ]
        self.ring_fields = [
            {
                name: (layout.shape, layout.dtype)
                for name, layout in replay.row_layout(replay_spec, (count, replay_spec.chunk_len))
                ._asdict()
                .items()
            }
            | {TRIAL_FIELD: ((count,), np.int32)}  # the trial each slot's rows are for
            for _, count in self.blocks
        ]
        self.stop_flag = None
        self.status = [None] * len(self.blocks)  # the receiving end of each collector's pipe
        self.results = None  # the receiving end of the evaluator's pipe
        self.result_backlog: list = []  # what a dead evaluator sent before its restart
        self.params = None
        self.eval_ring = None
        self.rings: list[ChunkRing] = []
        self.pending = [deque() for _ in self.blocks]
        self.restarts = [0] * len(self.blocks)
        self.evaluator_restarts = 0
        self.stats: dict[str, dict] = {}
        self.collectors: list = [None] * len(self.blocks)
        # Started as `evaluator_with_first_rows` says, or sooner if a snapshot is waited for
        # or fills its ring.
        self.evaluator, self.evaluator_with_first_rows = None, evaluator_with_first_rows
        self.delivered = [False] * len(self.blocks)  # whether each collector has sent rows yet
        self.started = time.monotonic()
        self.stopped = False

    def __enter__(self) -> Workers:
        # Segments are created here, inside the cleanup scope: an interruption half-way through
        # set-up still unlinks whatever exists.
        try:
            if reclaimed := reclaim_orphaned_segments():
                self.log(
                    f"removed {len(reclaimed)} shared-memory segment(s) of killed fastpop runs "
                    "from /dev/shm"
                )
            self.stop_flag = StopFlag.create()
            self.params = ParamChannel.create(self.initial_leaves)
            if self.published_version is not None:
                self.params.publish(self.initial_leaves)
            chunk_len = self.replay_spec.chunk_len
            for fields, (_, count) in zip(self.ring_fields, self.blocks, strict=True):
                self.rings.append(
                    ChunkRing.create(
                        fields,
                        self.config.collect.ring_slots,
                        max_episodes_per_chunk(count, chunk_len),
                    )
                )
            self.eval_ring = ChunkRing.create(snapshot.layout(self.initial_leaves), EVAL_SLOTS, 0)
            for index in range(len(self.blocks)):
                self._start_collector(index)
            self.started = time.monotonic()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        for channel in (self.params, self.eval_ring, *self.rings, self.stop_flag):
            if channel is not None:
                channel.close()
                channel.unlink()

    def _start_collector(self, index: int) -> None:
        first, count = self.blocks[index]
        entropy = [self.config.seed, first, self.restarts[index]]
        entropy += [self.generation] if self.generation else []
        seed = int(np.random.SeedSequence(entropy).generate_state(1)[0] % 2**31)
        spec = CollectorSpec(
            index,
            self.config_dict,
            self.collector_envs,
            first,
            count,
            self.row_layout,
            self.params.spec,
            self.rings[index].spec,
            self.stop_flag.spec,
            seed,
            mp.current_process().pid,
            self.numpy_policies[index],
        )
        receive, send = self.context.Pipe(duplex=False)
        process = self.context.Process(
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

    def _start_evaluator(self) -> None:
        spec = EvaluatorSpec(
            self.config_dict,
            self.eval_ring.spec,
            self.stop_flag.spec,
            self.config.seed + 10_000 * self.evaluator_restarts,
            mp.current_process().pid,
        )
        receive, send = self.context.Pipe(duplex=False)
        self.evaluator = self.context.Process(
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

    def publish_from(self, learner, copy=None) -> None:
        """`copy` (a `Learner.policy_copy`; None: of the current policies) to the collectors."""
        copy = learner.policy_copy() if copy is None else copy
        self.params.publish(learner.policy_leaves(copy))
        self.published_version = copy.version

    def publish_if_changed(self, learner, copy=None) -> None:
        """`publish_from` unless the collectors act with that version already; the first
        trained policies also start the evaluator."""
        if (learner.policy_version if copy is None else copy.version) != self.published_version:
            self.publish_from(learner, copy)
        if self.evaluator is None and learner.updates:
            self._start_evaluator()

    def feed(self, learner) -> list | None:
        """One chunk from every collector into the learner's replay; its finished episodes, or
        None when a collector has no chunk ready."""
        rows, episodes, trials = self.next_chunk()
        if rows is None:
            return None
        learner.insert(rows, trials)
        return episodes

    def next_chunk(self):
        """One chunk from every collector, concatenated over slots: (rows, finished episodes,
        per slot the trial its rows were collected for); (None, [], None) if not ready."""
        for index, (ring, pending) in enumerate(zip(self.rings, self.pending, strict=True)):
            if not pending:
                chunk = ring.try_get()
                if chunk is not None:
                    pending.append(chunk)
                    self.delivered[index] = True
        if self.evaluator is None and self.evaluator_with_first_rows and all(self.delivered):
            self._start_evaluator()  # after the collectors' start-up: the CPU was theirs
        if not all(self.pending):
            return None, [], None
        chunks = [pending.popleft() for pending in self.pending]
        rows = replay.Rows(
            **{
                name: np.concatenate([c.arrays[name] for c in chunks])
                for name in replay.Rows._fields
            }
        )
        trials = np.concatenate([c.arrays[TRIAL_FIELD] for c in chunks])
        return rows, [episode for chunk in chunks for episode in chunk.episodes], trials

    def waiting_on(self) -> str | None:
        """What start-up still waits for (the progress line says it), None once rows flow."""
        if all(self.delivered):
            return None
        ready = sum(self.delivered)
        return (
            f"{ready}/{len(self.delivered)} collectors sent their first rows "
            f"({time.monotonic() - self.started:.0f}s since they started: importing, making envs)"
        )

    def evaluate(self, arrays: dict) -> None:
        while not self.eval_ring.put(arrays, timeout=1.0 if self.evaluator else 0.0):
            if self.evaluator is None:
                self._start_evaluator()  # the ring filled before the first update
            self.check()  # a full ring means a slow evaluator: wait, but notice if it died

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        """Evaluation results that arrived, after waiting up to `timeout` s for the first."""
        if self.results is None:  # no evaluator yet
            if not (timeout and len(self.eval_ring)):
                return []
            self._start_evaluator()  # the run waits for snapshots taken before any update
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
                    lambda i=index: self._start_collector(i),
                )
        if self.evaluator is not None and self.evaluator.exitcode is not None:
            self.evaluator_restarts += 1
            reason = reasons.get(-1) or describe_exit(self.evaluator.exitcode)
            self._restart_or_fail(
                "evaluator", self.evaluator_restarts, reason, self._start_evaluator
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
        if count > self.config.collect.max_restarts:
            raise WorkerFailed(
                f"{name} died ({reason}) and was already restarted "
                f"{count - 1} times (collect.max_restarts)"
            )
        self.log(
            f"{name} died ({reason}); restarting it ({count}/{self.config.collect.max_restarts})"
        )
        self.log_event("worker_restart", {"worker": name, "reason": reason, "restart": count})
        start()

    def _failed(self, name: str, traceback_text: str) -> None:
        raise WorkerFailed(f"{name} failed: {traceback_text.strip().splitlines()[-1]}")

    def stop(self) -> dict[str, dict]:
        """Stops every process (politely, then by force) and returns their reported stats."""
        if self.stopped:
            return self.stats
        self.stopped = True
        if self.stop_flag is not None:
            self.stop_flag.set()
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

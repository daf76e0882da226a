"""The learner's side of the worker processes: start, feed, watch, restart and stop them.

Everything between the learner and its workers is shared memory (`worker_channels`, over `shm`)
or a pipe per worker (`worker_processes`): no `multiprocessing` Event, Queue or Lock, whose named
semaphores would outlive a run killed as a whole in /dev/shm. Shared-memory segments such a run
leaves are reclaimed at the next start.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import deque

import jax
import numpy as np

from fastpop.collect.acting import numpy_policy_for
from fastpop.collect.collector import TRIAL_FIELD, hparams_layout
from fastpop.collect.rows import RowLayout
from fastpop.collect.segments import memory_order_problem, reclaim_orphaned_segments
from fastpop.collect.worker_channels import WorkerChannels
from fastpop.collect.worker_processes import (
    ProcessParts,
    WorkerFailed,
    WorkerLaunch,
    WorkerProcesses,
)
from fastpop.population import replay


def split_slots(num_envs: int, num_collectors: int) -> list[tuple[int, int]]:
    """Contiguous (first_slot, num_slots) blocks, sizes differing by at most one."""
    base, extra = divmod(num_envs, num_collectors)
    blocks, first = [], 0
    for index in range(num_collectors):
        count = base + (index < extra)
        blocks.append((first, count))
        first += count
    return blocks


class Workers:
    """Collectors, the evaluator and their shared memory, as one context manager: the
    processes (`WorkerProcesses`) and the segments (`WorkerChannels`) are held apart; here,
    what the learner asks of them (policies out, chunks and evaluation results in).

    Leaving the context (normally, on an exception or on Ctrl-C) stops every process within a
    few seconds and unlinks every shared-memory segment.
    """

    chunks_per_pass = None  # the loop drains every chunk that is ready

    def __init__(
        self,
        parts: ProcessParts,
        initial_policy,
        replay_spec,
        log=print,
        log_event=None,
        generation: int = 0,
        policy_version: int | None = 0,
        evaluator_with_first_rows: bool = True,
    ):
        """`parts`: what the workers are made of (`RunParts.processes`, fastpop.run.parts).
        `initial_policy`: what the collectors act with first, as host arrays
        (`Learner.host_policy_tree`: stacked policy params, hparams, env steps per member).
        `replay_spec`: the learner's (`Learner.replay.spec`); collectors build their chunks
        with it rather than deriving their own. `generation`: resumes of the run so far.
        `policy_version`: the learner's `policy_version` when `initial_policy` was taken (see
        `publish_if_changed`); None: it is zeros of the policies' layout, not published
        (collectors started before the learner exists step their warm-up, then wait for
        `publish_from`). `evaluator_with_first_rows`: start the evaluator once every collector
        has sent rows (a strategy that pauses for its evaluations); False: with the first
        trained policies, so that it takes no CPU from the warm-up and the first update."""
        if (problem := memory_order_problem()) is not None:
            raise WorkerFailed(problem)
        self.log = log
        self.initial_leaves = jax.tree.leaves(initial_policy)
        self.published_version = policy_version
        collect, per_member = parts.collect, parts.collect.envs_per_member
        blocks = split_slots(parts.population_size * per_member, collect.num_collectors)
        # How each collector acts once its warm-up ends: in numpy where it can (it then never
        # imports JAX), else with the agent's jitted `act`.
        algo, std_min = parts.agent.algo, parts.agent.fields.get("exploration_std_min")
        numpy_policies = [
            numpy_policy_for(algo, parts.env_spec, initial_policy, count, per_member, std_min)
            for _, count in blocks
        ]
        # The evaluator's: one env per member, the deterministic action
        evaluator_policy = numpy_policy_for(
            algo, parts.env_spec, initial_policy, parts.population_size, 1
        )
        launch = WorkerLaunch(
            mp.get_context("spawn"),
            parts,
            RowLayout.of(replay_spec),
            blocks,
            numpy_policies,
            evaluator_policy,
            hparams_layout(initial_policy[1]),
            generation,
        )
        self.channels = WorkerChannels(replay_spec, blocks, collect.ring_slots)
        no_events = lambda kind, payload: None
        self.processes = WorkerProcesses(launch, self.channels, log, log_event or no_events)
        self.pending = [deque() for _ in blocks]
        # Started as `evaluator_with_first_rows` says, or sooner if a snapshot is waited for
        # or fills its ring.
        self.evaluator_with_first_rows = evaluator_with_first_rows
        self.delivered = [False] * len(blocks)  # whether each collector has sent rows yet
        self.started = time.monotonic()

    def __enter__(self) -> Workers:
        # Segments are created here, inside the cleanup scope: an interruption half-way through
        # set-up still unlinks whatever exists.
        try:
            if reclaimed := reclaim_orphaned_segments():
                self.log(
                    f"removed {len(reclaimed)} shared-memory segment(s) of killed fastpop runs "
                    "from /dev/shm"
                )
            self.channels.create(self.initial_leaves)
            if self.published_version is not None:
                self.channels.params.publish(self.initial_leaves)
            for index in range(len(self.pending)):
                self.processes.start_collector(index)
            self.started = time.monotonic()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self.channels.close()

    # What the run reads of the processes (fastpop.collect.sources, the results/ scripts).

    @property
    def log_event(self):
        return self.processes.log_event

    @log_event.setter
    def log_event(self, log_event) -> None:
        self.processes.log_event = log_event

    @property
    def collectors(self) -> list:
        return self.processes.collectors

    @property
    def evaluator_restarts(self) -> int:
        return self.processes.evaluator_restarts

    @property
    def stats(self) -> dict[str, dict]:
        return self.processes.stats

    def publish_from(self, learner, copy=None) -> None:
        """`copy` (a `Learner.policy_copy`; None: of the current policies) to the collectors."""
        copy = learner.policy_copy() if copy is None else copy
        self.channels.params.publish(learner.policy_leaves(copy))
        self.published_version = copy.version

    def publish_if_changed(self, learner, copy=None) -> None:
        """`publish_from` unless the collectors act with that version already; the first
        trained policies also start the evaluator."""
        if (learner.policy_version if copy is None else copy.version) != self.published_version:
            self.publish_from(learner, copy)
        if self.processes.evaluator is None and learner.updates:
            self.processes.start_evaluator()

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
        rings = self.channels.rings
        for index, (ring, pending) in enumerate(zip(rings, self.pending, strict=True)):
            if not pending:
                chunk = ring.try_get()
                if chunk is not None:
                    pending.append(chunk)
                    self.delivered[index] = True
        first_rows = self.evaluator_with_first_rows and all(self.delivered)
        if self.processes.evaluator is None and first_rows:
            self.processes.start_evaluator()  # after the collectors' start-up: the CPU was theirs
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
        processes = self.processes
        while not self.channels.eval_ring.put(arrays, timeout=1.0 if processes.evaluator else 0.0):
            if processes.evaluator is None:
                processes.start_evaluator()  # the ring filled before the first update
            self.check()  # a full ring means a slow evaluator: wait, but notice if it died

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        """Evaluation results that arrived, after waiting up to `timeout` s for the first."""
        if self.processes.results is None:  # no evaluator yet
            if not (timeout and len(self.channels.eval_ring)):
                return []
            self.processes.start_evaluator()  # the run waits for snapshots taken before any update
        return self.processes.evaluator_results(timeout)

    def check(self) -> None:
        """Notices dead workers: restarts them up to collect.max_restarts, else raises."""
        self.processes.check()

    def stop(self) -> dict[str, dict]:
        """Stops every process (politely, then by force) and returns their reported stats."""
        return self.processes.stop()

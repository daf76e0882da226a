"""Where a run's rows come from: the one place the two collection modes differ.

    ProcessCollection   collector processes step CPU simulators (gymnasium); rows arrive through
                        shared-memory rings and are copied to the device (`Workers`)
    DeviceCollection    device envs (brax, gymnax, Playground) stepped on the device by the
                        policy the learner trains; rows never leave it, no worker process is
                        started (fastpop.collect.device_collection)

Both are a `Collection`, the interface the run loop uses (a distributed run's, in
fastpop.distributed.multihost, is a third).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Protocol

import jax
import numpy as np

from fastpop.collect.worker_processes import ProcessParts
from fastpop.learn.learner import Learner
from fastpop.learn.policy_copy import PolicyCopy
from fastpop.population import replay


class Collection(Protocol):
    """What the run loop drives: rows into the learner, snapshots to evaluate, results back.

    `running` is the context in which it works (processes started, programs compiling); the
    learner is the one it feeds, already restored, and it acts with that learner's policies as
    `publish` hands them over. `feed` and `evaluations` are called on every pass of the loop,
    `publish` whenever `publishes_to` a new version: a collection that can fail (a worker process
    dying) raises there. What it holds for a checkpoint is `saved()` (an empty dict: nothing),
    put back by `restore` before it runs."""

    chunks_per_pass: int | None  # chunks the loop moves per pass (None: every one ready)

    @property
    def evaluator_restarts(self) -> int: ...

    def running(
        self, learner: Learner, log_event: Callable, generation: int
    ) -> contextlib.AbstractContextManager: ...

    def feed(self, learner: Learner) -> list | None:
        """One chunk into the learner: its finished episodes, or None when none was ready."""

    def publishes_to(self, version: int) -> bool:
        """Whether something acts with copies of the policies, of another version than
        `version` (a `Learner.policy_version`): what `publish` would send them."""

    def publish(self, learner: Learner, copy: PolicyCopy) -> None:
        """`copy` (a `Learner.policy_copy`, its update done) to whatever acts with copies of the
        policies (fastpop.run.update_pipeline: while the next update runs)."""

    def evaluate(self, arrays: dict) -> None:
        """Evaluate an encoded snapshot (fastpop.collect.snapshot) of the members' policies."""

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        """The results finished since the last call, waiting up to `timeout` for one."""

    def stop(self) -> dict: ...

    def saved(self) -> dict: ...

    def restore(self, tree: dict) -> None: ...


class ProcessCollection:
    """Collector and evaluator processes (fastpop.collect.workers), made of the run's
    `ProcessParts` and started by `running`. The processes rebuild their envs and agents from
    the parts' resolved config (agents do not cross the spawn boundary). They act with copies of
    the policies: on every pass the workers are checked, and `publish` sends the learner's
    policies if they changed (`Learner.policy_version`). Nothing to checkpoint: a resumed run
    starts new processes with new seeds."""

    chunks_per_pass = None  # the loop drains every chunk that is ready

    def __init__(
        self,
        parts: ProcessParts,
        replay_spec: replay.ReplaySpec,
        log=print,
        waits_for_evaluation=False,
    ):
        """`parts`: `RunParts.processes`; `waits_for_evaluation`: the strategy's (its evaluator
        starts with the collectors' first rows; otherwise with the first trained policies,
        `Workers`)."""
        self.parts, self.replay_spec, self.log = parts, replay_spec, log
        self.evaluator_with_first_rows = waits_for_evaluation
        self.workers = None  # while running
        # The run loop's stop check, made before a worker check (a group signal kills both).
        self.stop_check: Callable[[], None] = lambda: None

    def start_ahead(self, agent, hparams) -> None:
        """Starts a fresh run's collectors before its learner is made (run/startup.start_processes):
        their warm-up acts at random; at its end they wait for `running`'s first publish.
        `agent`, `hparams`: the learner's (`LearnerParts`), whose policies' layout the
        collectors' channel is made for (traced for shapes only)."""
        from fastpop.collect.collector import policy_template

        template = policy_template(agent, hparams)
        zeros = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template)
        workers = self._workers(zeros, policy_version=None)
        self.workers = workers.__enter__()
        # stopped by `running`, or at exit if the run fails before it starts
        self._stop_ahead = weakref.finalize(self, workers.__exit__, None, None, None)

    @contextlib.contextmanager
    def running(self, learner: Learner, log_event, generation: int) -> Iterator[None]:
        learner.replay.compile_insert_ahead()  # while the collectors start
        learner.compile_update_ahead()  # while they start and step their warm-up
        if self.workers is not None:  # started ahead: a fresh run's
            if generation:
                raise RuntimeError("collectors started ahead act for a fresh run, not a resume")
            self.workers.log_event = log_event
            self.workers.publish_from(learner)
            try:
                yield
            finally:
                self._stop_ahead()
            return
        policy, version = learner.host_policy_tree(), learner.policy_version
        with self._workers(policy, log_event, generation, version) as workers:
            self.workers = workers
            yield

    def _workers(self, policy, log_event=None, generation=0, policy_version=0):
        from fastpop.collect.workers import Workers

        early = self.evaluator_with_first_rows
        return Workers(
            *(self.parts, policy, self.replay_spec, self.log, log_event, generation),
            policy_version=policy_version,
            evaluator_with_first_rows=early,
        )

    @property
    def evaluator_restarts(self) -> int:
        return self.workers.evaluator_restarts

    def _keep_up(self) -> None:
        """Raise if a worker failed beyond its restarts (policies go out through `publish`:
        here they could wait for an update the device is still running)."""
        self.stop_check()
        self.workers.check()

    def feed(self, learner: Learner) -> list | None:
        self._keep_up()
        return self.workers.feed(learner)

    def publishes_to(self, version: int) -> bool:
        return self.workers.published_version != version

    def publish(self, learner: Learner, copy: PolicyCopy) -> None:
        self.workers.publish_if_changed(learner, copy)

    def waiting_on(self) -> str | None:
        """What start-up waits for: collectors not yet sending rows (None once all are)."""
        return self.workers.waiting_on()

    def evaluate(self, arrays: dict) -> None:
        self.workers.evaluate(arrays)

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        self._keep_up()
        return self.workers.evaluations(timeout)

    def stop(self) -> dict:
        return self.workers.stop()

    def saved(self) -> dict:
        return {}

    def restore(self, tree: dict) -> None:
        if tree:
            raise ValueError("process collection restores nothing: a checkpoint held env lanes")

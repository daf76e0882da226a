"""A run over several processes (`--distributed`): the same `Run` and loop on every process, in
lock step.

Each process holds a contiguous block of members (fastpop.population.sharding's mesh spans every
process's devices, process by process) and runs collectors and an evaluator for those members
only, made of the process parts of the config cut down to them (`local_parts`). Rows become
global arrays with `jax.make_array_from_process_local_data`: only a process's own rows cross to
its own devices.

The loop's decisions must be the same on every process, since each compiled call over the member
arrays is made by all of them: `LockstepCollection.agree`, called once per pass of the loop,
exchanges one small payload per process (fastpop.distributed.lockstep.Lockstep) and fixes for that
pass whether a chunk goes in (every process has one), which evaluation round is complete (every
process's returns for its members, joined in member order), the clock (process 0's), a stop (Ctrl-C
or SIGTERM on any process) and a worker failure (on any process). Everything else the loop decides
follows from state that is the same everywhere (the rate limiter, the pending rounds). Host reads of
member arrays are this process's shards (`HostLearner`) or all-gathers made at agreed points
(`sharding.to_host`).

Device mode (brax, gymnax, Playground ids) steps each process's members' envs on its own devices
(fastpop.distributed.device_lockstep).

Process 0 writes the run directory (metrics, lineage, plots, members, summary); process i > 0
writes only its own events under <run>/processes/<i>/. Checkpoints are written by every process
(fastpop.distributed.checkpoint_sharded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.collect.worker_processes import ProcessParts
from fastpop.collect.workers import WorkerFailed, Workers
from fastpop.distributed.checkpoint_sharded import ShardedCheckpoints
from fastpop.distributed.lockstep import WATCHDOG, AgreedSignals, Lockstep, ProcessLost, lost_from
from fastpop.learn.learner import Learner, LearnerParts, averaged_metrics
from fastpop.population import replay, sharding
from fastpop.run.loop import CHECKPOINTS_DIR, Run
from fastpop.run.metrics import MetricsWriter
from fastpop.run.parts import RunParts, process_parts
from fastpop.run.startup import RunPieces
from fastpop.run.stop_signals import stop_exception
from fastpop.strategies import registry as strategies

PROCESSES_DIR = "processes"


def local_config(config: config_lib.Config, process: int, count: int) -> config_lib.Config:
    """The config this process's collectors and evaluator run: its own members only, with
    seeds of their own (the strategy is the learner's business)."""
    data = config_lib.config_to_dict(config)
    size = config.population.size // count
    population = data["population"] | {"size": size, "devices": 1}
    population |= {"grid": {}, "priors": {}, "seeds": size}
    data |= {
        "population": population,
        "strategy": strategies.DEFAULT,  # members left alone
        "seed": config.seed + 7919 * process,
    }
    return config_lib.config_from_dict(data)


def local_parts(parts: RunParts, process: int, count: int) -> ProcessParts:
    """What this process's collectors and evaluator are made of: the run's process parts for
    `local_config` (the env spec is the run's)."""
    local = local_config(parts.config, process, count)
    return process_parts(local, parts.processes.env_spec)


class HostLearner(Learner):
    """The learner of one process: host reads give this process's members, inserted rows are
    this process's members' rows."""

    def __init__(self, parts: LearnerParts):
        super().__init__(parts)
        self.local_size = self.size // jax.process_count()
        self.first_member = jax.process_index() * self.local_size

    def _local(self, leaf) -> np.ndarray:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return sharding.local_members(leaf)
        leaf = np.asarray(leaf)
        if leaf.ndim and leaf.shape[0] == self.size:
            return leaf[self.first_member : self.first_member + self.local_size]
        return leaf

    def host_array(self, leaf) -> np.ndarray:
        """This process's members' part of a leaf of the policies, hparams and clocks (what its
        collectors act with)."""
        return self._local(leaf)

    def insert(self, rows, lane_epochs=None) -> None:
        """rows: this process's members' lanes, member-major; `lane_epochs`: every process's
        lanes' trials, as agreed (`LockstepCollection.agree`)."""
        super().insert(sharding.from_local_members(rows, self.mesh), lane_epochs)

    @property
    def last_metrics(self) -> dict[str, float]:
        """Averaged over this process's members (no communication: logged at any time)."""
        return averaged_metrics(self.calls.metrics or {}, self._local)


class HostEvents(MetricsWriter):
    """Process i > 0: its own events in <run>/processes/<i>/; the run's rows are process 0's."""

    def log_evaluation(self, rows: list[dict]) -> None:
        pass

    def log_scalars(self, step: int, values: dict) -> None:
        pass

    def log_lineage(self, events: list[dict]) -> None:
        pass


class LockstepCollection:
    """This process's collector and evaluator processes (`Workers`, of its own members: see
    `local_parts`), with the loop's decisions made together with the other processes (module
    docstring): `agree`, once per pass of the loop, through its `signals`' check. A `Collection`
    (fastpop.collect.sources); nothing to checkpoint."""

    chunks_per_pass = 1  # one agreed chunk per pass

    def __init__(
        self,
        lockstep: Lockstep,
        parts: ProcessParts,
        replay_spec: replay.ReplaySpec,
        log,
        local_elapsed: Callable[[], float],
    ):
        """parts: this process's (`local_parts`); local_elapsed: this process's run clock."""
        self.lockstep, self.parts, self.replay_spec, self.log = lockstep, parts, replay_spec, log
        self.signals, self.local_elapsed = AgreedSignals(self.agree), local_elapsed
        self.workers: Workers | None = None  # while running
        self.agreed_elapsed: float | None = None  # process 0's clock at the latest pass
        self.held = None  # (rows, episodes, trials) of a chunk waiting for the other processes'
        self.chunk_agreed = False
        self.agreed_trials = None  # every process's lanes' trials of the agreed chunk
        self.expected: list[int] = []  # eval indices handed to the evaluator, oldest first
        self.results: dict[int, dict] = {}  # this process's results by eval index
        self.agreed: list[dict] = []  # complete rounds, every member's returns
        self.failure: str | None = None

    @property
    def evaluator_restarts(self) -> int:
        return self.workers.evaluator_restarts

    @contextlib.contextmanager
    def running(self, learner: Learner, log_event, generation: int) -> Iterator[None]:
        policy, version = learner.host_policy_tree(), learner.policy_version
        parts, spec, log = self.parts, self.replay_spec, self.log
        workers = Workers(parts, policy, spec, log, log_event, generation, version)
        with workers:
            self.workers = workers
            self.agree()  # the processes start the loop together, on one clock
            yield

    def abandon(self) -> None:
        """Another process is lost (the watchdog's thread): no worker process, no segment left
        behind."""
        if self.workers is not None:
            self.workers.__exit__(None, None, None)

    def stop(self) -> dict:
        return self.workers.stop()

    def saved(self) -> dict:
        return {}

    def restore(self, tree: dict) -> None:
        if tree:
            raise ValueError("a distributed run restores no collection state")

    def evaluate(self, arrays: dict) -> None:
        from fastpop.collect import snapshot

        index = snapshot.decode(arrays)[1].eval_index
        if index not in self.expected:
            self.expected.append(index)
        self.workers.evaluate(arrays)

    def _gather_local(self, timeout: float = 0.0) -> None:
        try:
            for result in self.workers.evaluations(timeout):
                self.results[result["eval_index"]] = result
            if self.held is None:
                rows, episodes, trials = self.workers.next_chunk()
                self.held = None if rows is None else (rows, episodes, trials)
        except WorkerFailed as error:
            self.failure = str(error)

    def agree(self) -> None:
        """The agreement of one pass of the loop (raises the agreed stop or failure); policies
        go out through `publish` (here they could wait for an update still running)."""
        try:
            self.workers.check()
        except WorkerFailed as error:
            self.failure = str(error)
        self._gather_local()
        want = self.expected[0] if self.expected else None
        mine = self.results.get(want)
        payload = {
            "signal": self.signals.signal,
            "failure": self.failure,
            "elapsed": self.local_elapsed(),
            "chunk": None if self.held is None else self.held[2].tolist(),
            "result": None if mine is None else [mine["return_mean"], mine["return_std"]],
        }
        everyone = self.lockstep.exchange(payload)
        for process, theirs in enumerate(everyone):
            if theirs["failure"]:
                raise WorkerFailed(f"process {process}: {theirs['failure']}")
        signals = [theirs["signal"] for theirs in everyone if theirs["signal"] is not None]
        if signals:
            raise stop_exception(signals[0])
        self.agreed_elapsed = everyone[0]["elapsed"]
        self.chunk_agreed = all(theirs["chunk"] is not None for theirs in everyone)
        if self.chunk_agreed:  # the rows' trials decide what the learner keeps: on every one
            self.agreed_trials = np.concatenate([theirs["chunk"] for theirs in everyone])
        if all(theirs["result"] is not None for theirs in everyone):
            self.agreed.append(
                mine
                | {
                    "return_mean": [x for theirs in everyone for x in theirs["result"][0]],
                    "return_std": [x for theirs in everyone for x in theirs["result"][1]],
                }
            )
            del self.results[want]
            self.expected.pop(0)

    def publishes_to(self, version: int) -> bool:
        return self.workers.published_version != version

    def publish(self, learner, copy) -> None:
        self.workers.publish_if_changed(learner, copy)

    def feed(self, learner) -> list | None:
        if not self.chunk_agreed:
            return None
        self.chunk_agreed = False
        (rows, episodes, _), self.held = self.held, None
        learner.insert(rows, self.agreed_trials)
        first = learner.first_member
        return [episode._replace(member=episode.member + first) for episode in episodes]

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        agreed, self.agreed = self.agreed, []
        if not agreed and timeout:
            self._gather_local(timeout)  # waits here rather than spinning through the loop
        return agreed


class AgreedCheckpoints:
    """Every process's shards of each checkpoint (`ShardedCheckpoints`, opened when first used:
    a run that never writes one leaves no manager behind)."""

    def __init__(self, directory: Path, keep: int, agree):
        self.directory, self.keep, self.agree = directory, keep, agree
        self.store: ShardedCheckpoints | None = None

    def _opened(self) -> ShardedCheckpoints:
        if self.store is None:
            self.store = ShardedCheckpoints(self.directory, self.keep, self.agree)
        return self.store

    def save(self, step: int, tree, metadata: dict) -> Path:
        store = self._opened()
        if step in store.steps():  # the same step again: the newer state wins
            store.manager.delete(step)
        return store.save(step, tree, metadata)

    def describe(self, path: Path) -> tuple[dict, str]:
        return {"processes": jax.process_count()}, "every process's shards"

    def restore_latest(self, template, warn):
        return self._opened().restore_latest(template, warn)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


class DistributedRun(Run):
    """`Run` on one process of several (module docstring): the plain run made of this process's
    pieces (its members' learner and collection, agreed stops, sharded checkpoints)."""

    def __init__(self, parts: RunParts, run_dir: Path, log=print):
        process = jax.process_index()
        if process:
            log = lambda message, log=log: log(f"[process {process}] {message}")
        self.lockstep = Lockstep()
        learner = HostLearner(parts.learner)
        elapsed = lambda: self.progress.elapsed()
        if parts.collection_mode == "device":
            from fastpop.distributed.device_lockstep import LockstepDeviceCollection

            template = learner.policy_template()
            collection = LockstepDeviceCollection(self.lockstep, parts.device, template, elapsed)
        else:
            local = local_parts(parts, process, jax.process_count())
            collection = LockstepCollection(
                self.lockstep, local, parts.learner.replay_spec, log, elapsed
            )
        directory = run_dir / CHECKPOINTS_DIR
        self.checkpoint_store = AgreedCheckpoints(
            directory, parts.checkpoints_kept, self.lockstep.exchange
        )
        pieces = RunPieces(learner, collection, collection.signals, self.checkpoint_store)
        super().__init__(parts, run_dir, log, pieces)
        if process:  # its own files only; the run directory is process 0's
            self.run_dir = Path(run_dir) / PROCESSES_DIR / str(process)

    def run(self) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        WATCHDOG.emergency.append(self._emergency)
        try:
            return super().run()
        except ProcessLost as error:
            self._note_lost(error)
            raise
        except jax.errors.JaxRuntimeError as error:
            if (lost := lost_from(error)) is None:
                raise
            self._note_lost(lost)
            raise lost from None
        finally:
            self.checkpoint_store.close()

    def _note_lost(self, error: ProcessLost) -> None:
        with MetricsWriter(self.run_dir, tensorboard=False) as events:
            events.log_event("process_lost", {"process": error.process, "message": str(error)})

    def _emergency(self, error: ProcessLost) -> None:
        """The watchdog's (another thread's) last acts while this loop waits on the lost one."""
        self.collection.abandon()
        self._note_lost(error)

    def elapsed(self) -> float:
        """The clock every process agreed on at the latest pass of the loop."""
        agreed = self.collection.agreed_elapsed
        return super().elapsed() if agreed is None else agreed

    def _summary(self, stopped_by: str, worker_stats: dict) -> dict:
        """The run's summary and the lock step's cost: exchanges with the other processes and
        the seconds spent in them (waits for a slower process included)."""
        summary = super()._summary(stopped_by, worker_stats)
        exchanges, seconds = self.lockstep.step, self.lockstep.seconds
        summary["lockstep"] = {"exchanges": exchanges, "seconds": seconds}
        if exchanges:
            self.log(
                f"lock step: {exchanges:,} exchanges with the other processes, "
                f"{1000 * seconds / exchanges:.2f} ms each on average (waits included)"
            )
        return summary

    def open_metrics(self, purge_step):
        if jax.process_index() == 0:
            return super().open_metrics(purge_step)
        return HostEvents(self.run_dir, tensorboard=False)

"""A run over several processes (`--distributed`): the same `Run` and loop on every process, in
lock step.

Each process holds a contiguous block of members (fastpop.population.sharding's mesh spans every
process's devices, process by process) and runs collectors and an evaluator for those members
only, with the config cut down to them (`local_config`). Rows become global arrays with
`jax.make_array_from_process_local_data`: only a process's own rows cross to its own devices.

The loop's decisions must be the same on every process, since each compiled call over the
member arrays is made by all of them: `LockstepWorkers.check`, called once per pass of the loop,
exchanges one small payload per process (lockstep.Lockstep) and fixes for that pass
whether a chunk goes in (every process has one), which evaluation round is complete (every
process's returns for its members, joined in member order), the clock (process 0's), a stop
(Ctrl-C or SIGTERM on any process) and a worker failure (on any process). Everything else the
loop decides follows from state that is the same everywhere (the rate limiter, the pending
rounds). Host reads of member arrays are this process's shards (`HostLearner`) or all-gathers
made at agreed points (`sharding.to_host`).

Process 0 writes the run directory (metrics, lineage, plots, members, summary); process i > 0
writes only its own events under <run>/processes/<i>/. Checkpoints are written by every process
(fastpop.distributed.checkpoint_sharded).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.collect.workers import WorkerFailed, Workers
from fastpop.distributed.checkpoint_sharded import ShardedCheckpoints
from fastpop.distributed.lockstep import WATCHDOG, Lockstep, ProcessLost, lost_from
from fastpop.learn.learner import Learner
from fastpop.population import sharding
from fastpop.run import run_state
from fastpop.run.loop import Run
from fastpop.run.metrics import MetricsWriter
from fastpop.run.stop_signals import StopSignals, stop_exception

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
        "strategy": "independent",
        "seed": config.seed + 7919 * process,
    }
    return config_lib.config_from_dict(data)


class HostLearner(Learner):
    """The learner of one process: host reads give this process's members, inserted rows are
    this process's members' rows."""

    def __init__(self, config, spec, agent):
        super().__init__(config, spec, agent)
        self.local_size = config.population.size // jax.process_count()
        self.first_member = jax.process_index() * self.local_size

    def _local(self, leaf) -> np.ndarray:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return sharding.local_members(leaf)
        leaf = np.asarray(leaf)
        if leaf.ndim and leaf.shape[0] == self.config.population.size:
            return leaf[self.first_member : self.first_member + self.local_size]
        return leaf

    def policy_leaves(self) -> list[np.ndarray]:
        """This process's members' policies and hparams (what its collectors act with)."""
        return [self._local(leaf) for leaf in jax.tree.leaves(self.policy_tree())]

    def insert(self, rows) -> None:
        """rows: this process's members' lanes, member-major."""
        split, count = sharding.members(self.mesh), jax.process_count()

        def to_global(x):
            shape = (x.shape[0] * count, *x.shape[1:])
            return jax.make_array_from_process_local_data(split, np.asarray(x), shape)

        super().insert(jax.tree.map(to_global, rows))

    @property
    def last_metrics(self) -> dict[str, float]:
        """Averaged over this process's members (no communication: logged at any time)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all NaN: no update yet
            return {
                f"learner/{k}": float(np.nanmean(self._local(v)))
                for k, v in (self._metrics or {}).items()
            }


class HostEvents(MetricsWriter):
    """Process i > 0: its own events in <run>/processes/<i>/; the run's rows are process 0's."""

    def log_evaluation(self, rows: list[dict]) -> None:
        pass

    def log_scalars(self, step: int, values: dict) -> None:
        pass

    def log_lineage(self, events: list[dict]) -> None:
        pass


class AgreedSignals(StopSignals):
    """Ctrl-C / SIGTERM are remembered here and acted on when every process knows of them
    (`LockstepWorkers.check`); a repeated signal still stops this process at once."""

    def check(self) -> None:
        pass


class LockstepWorkers:
    """This process's `Workers`, behind the run loop's interface, with the loop's decisions made
    together with the other processes (module docstring)."""

    chunks_per_pass = 1  # one agreed chunk per pass

    def __init__(self, run: DistributedRun, workers: Workers):
        self.run, self.workers, self.lockstep = run, workers, run.lockstep
        self.held = None  # (rows, episodes) of a chunk waiting for the other processes'
        self.chunk_agreed = False
        self.expected: list[int] = []  # eval indices handed to the evaluator, oldest first
        self.results: dict[int, dict] = {}  # this process's results by eval index
        self.agreed: list[dict] = []  # complete rounds, every member's returns
        self.failure: str | None = None

    @property
    def evaluator_restarts(self) -> int:
        return self.workers.evaluator_restarts

    def __enter__(self) -> LockstepWorkers:
        self.workers.__enter__()
        try:
            self.check()  # the processes start the loop together, on one clock
        except BaseException:
            self.workers.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.workers.__exit__(*exc)

    def stop(self) -> dict:
        return self.workers.stop()

    def publish_from(self, learner) -> None:
        self.workers.publish(learner.policy_leaves())

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
                rows, episodes = self.workers.next_chunk()
                self.held = None if rows is None else (rows, episodes)
        except WorkerFailed as error:
            self.failure = str(error)

    def check(self) -> None:
        """The agreement of one pass of the loop (raises the agreed stop or failure)."""
        try:
            self.workers.check()
        except WorkerFailed as error:
            self.failure = str(error)
        self._gather_local()
        want = self.expected[0] if self.expected else None
        mine = self.results.get(want)
        payload = {
            "signal": self.run.signals.signal,
            "failure": self.failure,
            "elapsed": self.run.progress.elapsed(),
            "chunk": self.held is not None,
            "result": None if mine is None else [mine["return_mean"], mine["return_std"]],
        }
        everyone = self.lockstep.exchange(payload)
        for process, theirs in enumerate(everyone):
            if theirs["failure"]:
                raise WorkerFailed(f"process {process}: {theirs['failure']}")
        signals = [theirs["signal"] for theirs in everyone if theirs["signal"] is not None]
        if signals:
            raise stop_exception(signals[0])
        self.run.agreed_elapsed = everyone[0]["elapsed"]
        self.chunk_agreed = all(theirs["chunk"] for theirs in everyone)
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

    def feed(self, learner) -> list | None:
        if not self.chunk_agreed:
            return None
        self.chunk_agreed = False
        (rows, episodes), self.held = self.held, None
        learner.insert(rows)
        first = learner.first_member
        return [episode._replace(member=episode.member + first) for episode in episodes]

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        agreed, self.agreed = self.agreed, []
        if not agreed and timeout:
            self._gather_local(timeout)  # waits here rather than spinning through the loop
        return agreed


class DistributedCollection:
    """Process-mode collection of this process's members (fastpop.collect.sources)."""

    def __init__(self, run: DistributedRun):
        self.run = run

    def saved(self) -> dict:
        return {}

    def restore(self, tree: dict) -> None:
        pass

    def open(self, log, log_event, generation: int) -> LockstepWorkers:
        run = self.run
        config = local_config(run.config, jax.process_index(), jax.process_count())
        leaves, spec = run.learner.policy_leaves(), run.learner.replay_spec
        workers = Workers(config, leaves, spec, log, log_event=log_event, generation=generation)
        return LockstepWorkers(run, workers)


class DistributedRun(Run):
    """`Run` on one process of several (module docstring)."""

    learner_class = HostLearner

    def __init__(self, config, run_dir: Path, log=print):
        process = jax.process_index()
        if process:
            log = lambda message, log=log: log(f"[process {process}] {message}")
        super().__init__(config, run_dir, log)
        self.lockstep = Lockstep()
        self.signals = AgreedSignals()
        self.collection = DistributedCollection(self)
        self.agreed_elapsed: float | None = None
        self._checkpoints: ShardedCheckpoints | None = None  # made when first used
        if process:  # its own files only; the run directory is process 0's
            self.run_dir = Path(run_dir) / PROCESSES_DIR / str(process)

    @property
    def checkpoints(self) -> ShardedCheckpoints:
        if self._checkpoints is None:
            keep = self.config.checkpoint.keep
            self._checkpoints = ShardedCheckpoints(
                self.checkpoint_dir, keep, self.lockstep.exchange
            )
        return self._checkpoints

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
            if self._checkpoints is not None:
                self._checkpoints.close()

    def _note_lost(self, error: ProcessLost) -> None:
        with MetricsWriter(self.run_dir, tensorboard=False) as events:
            events.log_event("process_lost", {"process": error.process, "message": str(error)})

    def _emergency(self, error: ProcessLost) -> None:
        """The watchdog's (another thread's) last acts while this loop waits on the lost one."""
        workers = getattr(self, "workers", None)
        if workers is not None:
            workers.__exit__(None, None, None)  # no worker process, no segment left behind
        self._note_lost(error)

    def elapsed(self) -> float:
        """The clock every process agreed on at the latest pass of the loop."""
        if self.agreed_elapsed is None:
            return super().elapsed()
        return self.agreed_elapsed

    def open_metrics(self, purge_step):
        if jax.process_index() == 0:
            return super().open_metrics(purge_step)
        return HostEvents(self.run_dir, tensorboard=False)

    def save_checkpoint(self, reason: str) -> Path:
        start = time.perf_counter()
        with self.watch.phase(f"writing a checkpoint ({reason})"):
            tree, metadata = run_state.capture(self, reason)
            steps = self.member_env_steps
            if steps in self.checkpoints.steps():  # the same step again: the newer state wins
                self.checkpoints.manager.delete(steps)
            path = self.checkpoints.save(steps, tree, metadata)
        seconds = time.perf_counter() - start
        self.timers["checkpoints"] += seconds
        self.progress.last_checkpoint = (self.elapsed(), self.member_env_steps)
        self.metrics.log_event(
            "checkpoint",
            {"path": str(path), "reason": reason, "member_env_steps": steps, "seconds": seconds}
            | {"processes": jax.process_count(), "replay": self.config.checkpoint.replay},
        )
        self.log(f"checkpoint {path} ({reason}; every process's shards in {seconds:.1f}s)")
        return path

    def restore_latest(self, warn=print) -> Path:
        tree, metadata, path = self.checkpoints.restore_latest(self.checkpoint_template, warn)
        self.restore(tree, metadata, path)
        return path

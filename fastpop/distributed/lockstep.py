"""Several processes (hosts) training one population: `--distributed`, jax.distributed's
start-up, and the lock step the processes keep.

    fastpop train CONFIG --distributed [--coordinator HOST:PORT --num-processes N --process-id I]

Without the three flags, jax.distributed detects them (Slurm's srun, Open MPI's mpirun, ...);
`--distributed` where nothing is detected is refused (exit 2) before anything starts.

The processes agree on every decision of the run loop through `Lockstep.exchange`: each writes a
small JSON payload under a per-step key of jax.distributed's key-value store (the coordinator,
process 0) and reads every other process's. A read waits in slices of `SLICE_MS`; between slices
the coordination service's liveness of the awaited process is asked (`get_live_nodes`, driven by
JAX's heartbeats, `HEARTBEAT_SECONDS`), so a dead process is named within about
HEARTBEAT_SECONDS + a slice, while a live one that is busy (compiling, writing a checkpoint) is
waited for. Collectives of a dead peer (gloo on CPU) fail at once rather than hang.

Recoverability (`jax_enable_recoverability`) is switched on so that the coordination service does
not abort every process when one dies: the survivors stop by themselves, naming the lost one.
If process 0 (the coordinator) dies, JAX's client aborts the others at once ("Terminating process
because the JAX distributed service detected fatal errors"): bounded, but without their message.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable

from fastpop.run.stop_signals import StopSignals
from fastpop.schema import ConfigError

HEARTBEAT_SECONDS = 10  # a process silent this long is dead (JAX's coordination service)
GRACE_SECONDS = 3.0  # the loop's own notice of a lost process, before the watchdog acts
SLICE_MS = 1000
KEY_PREFIX = "fastpop/lockstep"
DONE_PREFIX = "fastpop/done"  # a process that ended normally, not lost
END_KEY = "fastpop/end"  # the coordinator has seen every process done
DETECTION_HELP = (
    "pass --coordinator HOST:PORT --num-processes N --process-id I to every process (the "
    "coordinator is process 0's host and a free port), or start the processes with srun (Slurm) "
    "or mpirun (Open MPI), whose environment jax.distributed reads"
)


class ProcessLost(RuntimeError):
    """Another process of the run stopped answering; the message names it."""

    def __init__(self, process: int, detail: str = ""):
        name = {0: "process 0 (the coordinator)", -1: "another process"}.get(
            process, f"process {process}"
        )
        super().__init__(
            f"{name} of the distributed run is gone (no heartbeat for {HEARTBEAT_SECONDS} s"
            f"{'; ' + detail if detail else ''}); the newest complete checkpoint is intact: "
            "continue with fastpop resume RUN_DIR --distributed on every process"
        )
        self.process = process


def add_arguments(parser) -> None:
    group = parser.add_argument_group("several processes (hosts): jax.distributed")
    group.add_argument(
        "--distributed",
        action="store_true",
        help="train one population over the devices of several processes (hosts); see "
        "README 'More devices, more machines'",
    )
    group.add_argument("--coordinator", default=None, metavar="HOST:PORT", help=DETECTION_HELP)
    group.add_argument("--num-processes", type=int, default=None, metavar="N")
    group.add_argument("--process-id", type=int, default=None, metavar="I")


def _detected() -> bool:
    """An environment jax.distributed can read the coordinator from (Slurm, Open MPI, ...)."""
    from jax._src import clusters

    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    for cluster in clusters.ClusterEnv._cluster_types:
        try:
            if cluster.opt_in_only_method:
                continue
            if cluster.is_env_present():
                return True
        except Exception:  # a detector that cannot even look is not a detection
            continue
    return False


def resolve(args) -> dict | None:
    """The arguments of jax.distributed.initialize from the flags (None without --distributed);
    ConfigError for flags that cannot start a run."""
    flags = {"--coordinator": args.coordinator, "--num-processes": args.num_processes}
    flags["--process-id"] = args.process_id
    given = [name for name, value in flags.items() if value is not None]
    if not args.distributed:
        if given:
            raise ConfigError(f"{given[0]} belongs to --distributed; add --distributed")
        return None
    if args.coordinator is not None:
        missing = [name for name, value in flags.items() if value is None]
        if missing:
            raise ConfigError(f"--coordinator needs {' and '.join(missing)} too; {DETECTION_HELP}")
        host, _, port = args.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--coordinator {args.coordinator}: expected HOST:PORT")
        if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
            raise ConfigError(
                f"--process-id {args.process_id} --num-processes {args.num_processes}: the "
                "process ids are 0 .. N-1 and N >= 1"
            )
    elif given:
        raise ConfigError(f"{given[0]} without --coordinator; {DETECTION_HELP}")
    elif not _detected():
        raise ConfigError(f"--distributed: no coordinator given or detected; {DETECTION_HELP}")
    return {
        "coordinator_address": args.coordinator,
        "num_processes": args.num_processes,
        "process_id": args.process_id,
    }


def check_parts(parts) -> None:
    """What a distributed run cannot be (exit 2 before anything starts); `parts` is the run's
    `fastpop.run.parts.RunParts`. Every strategy, collection mode and replay layout runs: the
    member axis (and a shared critic or replay, replicated) spans every process's devices."""
    config = parts.config
    if config.population.devices == 1:
        raise ConfigError(
            "population.devices: 1, but --distributed spreads the members over every "
            "process's devices; set population.devices: all"
        )


def initialize(arguments: dict) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
    jax.config.update("jax_enable_recoverability", True)  # see the module docstring
    jax.distributed.initialize(
        **arguments,
        heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
        shutdown_timeout_seconds=30,
    )


class Lockstep:
    """The processes' agreement on each step (module docstring)."""

    def __init__(self):
        import jax
        from jax._src.distributed import global_state

        self.client = global_state.client
        self.process, self.count = jax.process_index(), jax.process_count()
        self.step = 0
        self.seconds = 0.0  # in `exchange`, waits for the slowest process included

    def _key(self, step: int, process: int) -> str:
        return f"{KEY_PREFIX}/{step}/{process}"

    def exchange(self, payload) -> list:
        """Every process's payload (JSON data), in process order."""
        start = time.perf_counter()
        try:
            return self._exchange(payload)
        finally:
            self.seconds += time.perf_counter() - start

    def _exchange(self, payload) -> list:
        step, self.step = self.step, self.step + 1
        self.client.key_value_set(self._key(step, self.process), json.dumps(payload))
        if step >= 2:  # every process has read it: each wrote step - 1 after reading it
            self.client.key_value_delete(self._key(step - 2, self.process))
        payloads = []
        for other in range(self.count):
            if other == self.process:
                payloads.append(payload)
            else:
                payloads.append(json.loads(self._wait(self._key(step, other), other)))
        return payloads

    def _wait(self, key: str, process: int) -> str:
        return wait_for_key(self.client, key, process, self.count)

    def agree(self, value) -> list:
        return self.exchange(value)


def wait_for_key(client, key: str, process: int, count: int) -> str:
    """The value `process` writes under `key`: waited for as long as that process is alive (it
    may be compiling or writing a checkpoint), ProcessLost about a heartbeat after it died."""
    while True:
        try:
            return client.blocking_key_value_get(key, SLICE_MS)
        except Exception as error:  # DEADLINE_EXCEEDED, or the service is gone
            if "DEADLINE_EXCEEDED" not in str(error):
                raise ProcessLost(process, str(error).splitlines()[0]) from None
        if process not in client.get_live_nodes(list(range(count))):
            with contextlib.suppress(Exception):  # it wrote the key, then ended normally
                return client.key_value_try_get(key)
            WATCHDOG.handled.set()  # the caller stops by itself
            raise ProcessLost(process)


def finish(lost: bool, code: int) -> None:
    """End this process of a distributed run. After a lost peer: at once (JAX's shutdown would
    wait for it). Otherwise in step with the others, since JAX's own shutdown barrier does not
    hold recoverable tasks: each process says it is done; the coordinator (process 0, whose
    service the others talk to) waits until every other one is done, however long a live one
    takes to get there, and says so (END_KEY); the others then disconnect, and the coordinator
    shuts the service down once they have. (Shutting it down first makes a process that is
    still disconnecting abort.)"""
    import jax
    from jax._src.distributed import global_state

    sys.stdout.flush()
    sys.stderr.flush()
    if lost:
        os._exit(code)
    client, me, count = global_state.client, jax.process_index(), jax.process_count()
    client.key_value_set(f"{DONE_PREFIX}/{me}", "1", allow_overwrite=True)
    try:
        if me == 0:
            for other in range(1, count):
                wait_for_key(client, f"{DONE_PREFIX}/{other}", other, count)
            client.key_value_set(END_KEY, "1", allow_overwrite=True)
        else:
            wait_for_key(client, END_KEY, 0, count)
    except ProcessLost as error:
        print(f"fastpop: error: {error}", file=sys.stderr, flush=True)
        os._exit(code or 1)
    WATCHDOG.stop()
    if me == 0:
        _wait_for_disconnects(client, count)
    jax.distributed.shutdown()


def _wait_for_disconnects(client, count: int, seconds: float = HEARTBEAT_SECONDS) -> None:
    """Until no other process is connected, at most `seconds`. The coordination service's
    `get_live_nodes` is a barrier: it returns once every connected process of the set has
    called it, so it returns {0} once the others, which call it no more, have disconnected."""
    everyone, deadline = list(range(count)), time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        live: list = []

        def ask(live=live) -> None:
            with contextlib.suppress(Exception):  # the service going away ends the wait too
                live.append(set(client.get_live_nodes(everyone)))

        asking = threading.Thread(target=ask, name="fastpop-disconnects", daemon=True)
        asking.start()
        asking.join(left)
        if not live or live[0] <= {0}:
            return


def lost_from(error: Exception) -> ProcessLost | None:
    """A collective that failed because a peer is gone (gloo: connection reset or closed), as
    the `ProcessLost` naming it; None for any other error."""
    text = str(error)
    if not any(sign in text for sign in ("Gloo", "Connection", "UNAVAILABLE")):
        return None
    WATCHDOG.handled.set()
    return ProcessLost(wait_for_lost(), f"a collective failed: {text.splitlines()[0]}")


def wait_for_lost(seconds: float = HEARTBEAT_SECONDS + 5) -> int:
    """The first process the coordination service finds dead within `seconds` (-1: none)."""
    import jax
    from jax._src.distributed import global_state

    everyone = list(range(jax.process_count()))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            live = global_state.client.get_live_nodes(everyone)
        except Exception:
            return 0  # the coordination service itself is gone
        if missing := sorted(set(everyone) - set(live)):
            return missing[0]
        time.sleep(0.2)
    return -1


class Watchdog:
    """Ends this process when another is gone while this one waits where nothing notices it
    (a collective whose peer died mid-way can wait for a long time): after GRACE_SECONDS
    without the loop's own notice, the emergency hooks run (stop the workers, note the loss)
    and the process exits with the message."""

    def __init__(self):
        self.handled = threading.Event()
        self._stopped = threading.Event()
        self.emergency: list[Callable[[ProcessLost], None]] = []

    def start(self) -> None:
        threading.Thread(target=self._watch, name="fastpop-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _lost(self) -> int | None:
        import jax
        from jax._src.distributed import global_state

        client, everyone = global_state.client, list(range(jax.process_count()))
        try:
            missing = set(everyone) - set(client.get_live_nodes(everyone))
        except Exception:
            return 0  # the coordination service (process 0) is gone
        for process in sorted(missing):
            try:
                client.key_value_try_get(f"{DONE_PREFIX}/{process}")
            except Exception:  # not found: it did not end normally
                return process
        return None

    def _watch(self) -> None:
        while not self._stopped.wait(1.0):
            process = self._lost()
            if process is None:
                continue
            if self.handled.wait(GRACE_SECONDS) or self._stopped.is_set():
                return
            error = ProcessLost(process, "noticed while waiting on it")
            for hook in self.emergency:
                with contextlib.suppress(Exception):
                    hook(error)
            print(f"fastpop: error: stopping: {error}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)


WATCHDOG = Watchdog()


class AgreedSignals(StopSignals):
    """Ctrl-C / SIGTERM are remembered here and acted on when every process knows of them: the
    loop's check, once per pass, is the processes' agreement (`LockstepCollection.agree`), which
    raises the agreed stop. A repeated signal still stops this process at once."""

    def __init__(self, agree: Callable[[], None]):
        super().__init__()
        self.agree = agree

    def check(self) -> None:
        self.agree()

"""Several processes (hosts) training one population (`--distributed`; its flags are
`fastpop.distributed.flags`): jax.distributed's start-up and the lock step the processes keep.

The processes agree on every decision of the run loop through `Lockstep.exchange`: each writes a
small JSON payload under a per-step key of jax.distributed's key-value store (the coordinator,
process 0) and reads every other process's. A read waits in slices of `SLICE_MS`; between slices
the coordination service's liveness of the awaited process is asked (`get_live_nodes`, driven by
JAX's heartbeats, `heartbeat_seconds()`, `--heartbeat-seconds`), so a dead process is named
within about a heartbeat timeout + a slice, while a live one that is busy (compiling, writing a
checkpoint) is waited for. Collectives of a dead peer (gloo on CPU) fail at once rather than hang.

Recoverability (`jax_enable_recoverability`) is switched on so that the coordination service does
not abort every process when one dies: the survivors stop by themselves, naming the lost one,
process 0 last (`leave_after_loss`: the others talk to its service). If process 0 (the
coordinator) dies, JAX's client aborts the others at once ("Terminating process because the JAX
distributed service detected fatal errors"): bounded, but without their message.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable

from fastpop.compilation import every_process_writes
from fastpop.distributed.flags import DEFAULT_HEARTBEAT_SECONDS
from fastpop.run.stop_signals import StopSignals

_heartbeat_seconds = DEFAULT_HEARTBEAT_SECONDS  # this run's, set by `initialize`
GRACE_SECONDS = 3.0  # the loop's own notice of a lost process, before the watchdog acts
SLICE_MS = 1000
KEY_PREFIX = "fastpop/lockstep"
DONE_PREFIX = "fastpop/done"  # a process that ended normally, not lost
STOPPED_PREFIX = "fastpop/stopped"  # a process that stopped because another was lost
END_KEY = "fastpop/end"  # the coordinator has seen every process done


class ProcessLost(RuntimeError):
    """Another process of the run stopped answering; the message names it."""

    def __init__(self, process: int, detail: str = ""):
        name = {0: "process 0 (the coordinator)", -1: "another process"}.get(
            process, f"process {process}"
        )
        super().__init__(
            f"{name} of the distributed run is gone (no heartbeat for {heartbeat_seconds()} s"
            f"{'; ' + detail if detail else ''}); the newest complete checkpoint is intact: "
            "continue with fastpop resume RUN_DIR --distributed on every process"
        )
        self.process = process


def heartbeat_seconds() -> int:
    """How long a process of this run may be silent before it counts as lost."""
    return _heartbeat_seconds


def initialize(arguments: dict) -> None:
    """jax.distributed's start, `arguments` from `fastpop.distributed.flags.resolve`."""
    import jax

    global _heartbeat_seconds
    _heartbeat_seconds = arguments["heartbeat_timeout_seconds"]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
    jax.config.update("jax_enable_recoverability", True)  # see the module docstring
    jax.distributed.initialize(**arguments, shutdown_timeout_seconds=30)
    every_process_writes.install()  # else only process 0's programs are ever cached on a CPU


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
        leave_after_loss(code)
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
        leave_after_loss(code or 1)
    WATCHDOG.stop()
    if me == 0:
        _wait_for_disconnects(client, count)
    jax.distributed.shutdown()


def _live_nodes(client, processes: list[int], seconds: float) -> set[int] | None:
    """Which of `processes` the coordination service finds alive; None if it does not answer
    within `seconds` (or is gone). Its `get_live_nodes` is a barrier: it returns once every
    connected process of the set has called it (each one's watchdog does, every second)."""
    live: list = []

    def ask() -> None:
        with contextlib.suppress(Exception):
            live.append(set(client.get_live_nodes(processes)))

    asking = threading.Thread(target=ask, name="fastpop-live-nodes", daemon=True)
    asking.start()
    asking.join(max(seconds, 0.0))
    return live[0] if live else None


def _wait_for_disconnects(client, count: int) -> None:
    """Until no other process is connected, at most a heartbeat timeout: `get_live_nodes`
    returns {0} once the others, which call it no more, have disconnected."""
    deadline = time.monotonic() + heartbeat_seconds()
    while (left := deadline - time.monotonic()) > 0:
        live = _live_nodes(client, list(range(count)), left)
        if live is None or live <= {0}:
            return


def leave_after_loss(code: int) -> None:
    """End this process after another was lost. Each survivor says it is stopping; the
    coordinator (process 0, whose service the others talk to) leaves last, once every live
    survivor has said so: JAX's client aborts, without fastpop's message, a process whose
    coordination service went away under it."""
    import jax
    from jax._src.distributed import global_state

    client, me = global_state.client, jax.process_index()
    with contextlib.suppress(Exception):  # the service is gone when process 0 is
        client.key_value_set(f"{STOPPED_PREFIX}/{me}", "1", allow_overwrite=True)
    if me == 0:
        wait_for_survivors(client, jax.process_count())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_for_survivors(client, count: int, seconds: float | None = None) -> list[int]:
    """Until every other live process has stopped or ended (its key is written), at most
    `seconds` (default: a survivor notices a loss within a heartbeat timeout and the watchdog's
    grace); the processes still running then."""
    if seconds is None:
        seconds = heartbeat_seconds() + GRACE_SECONDS + 2
    deadline = time.monotonic() + seconds
    while True:
        # Only those yet to speak are asked about: one that spoke and exited is not noticed
        # by the service for a heartbeat, and the barrier would wait for it.
        unspoken = [p for p in range(1, count) if not _said_it_ended(client, p)]
        if not unspoken:
            return []
        live = _live_nodes(client, [0, *unspoken], deadline - time.monotonic()) or set()
        running = [p for p in unspoken if p in live]
        if not running or time.monotonic() >= deadline:
            return running
        time.sleep(0.2)


def _said_it_ended(client, process: int) -> bool:
    for prefix in (STOPPED_PREFIX, DONE_PREFIX):
        with contextlib.suppress(Exception):  # not found
            client.key_value_try_get(f"{prefix}/{process}")
            return True
    return False


def lost_from(error: Exception) -> ProcessLost | None:
    """A collective that failed because a peer is gone (gloo: connection reset or closed), as
    the `ProcessLost` naming it; None for any other error."""
    text = str(error)
    if not any(sign in text for sign in ("Gloo", "Connection", "UNAVAILABLE")):
        return None
    WATCHDOG.handled.set()
    return ProcessLost(wait_for_lost(), f"a collective failed: {text.splitlines()[0]}")


def wait_for_lost() -> int:
    """The first process the coordination service finds dead within a heartbeat timeout and
    5 s (-1: none)."""
    import jax
    from jax._src.distributed import global_state

    everyone = list(range(jax.process_count()))
    deadline = time.monotonic() + heartbeat_seconds() + 5
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
            leave_after_loss(1)


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

"""The run loop's population updates, one kept in flight on the device while the host publishes
the policies of the one before it to the collectors.

JAX dispatches an update and returns at once; the device runs it while the host goes on. A pass
of the loop that may update dispatches update n+1 before it publishes update n's policies:

    host:    rows in | dispatch n+1 | wait for n, n's policies to shared memory | rows in | ...
    device:  ... update n | n's policies | update n+1 ..................................

so that the device has update n+1 queued while the host copies n's policies and writes them
(they waited for each other in turn: the H200's learner was busy half the time,
results/gpu/nvidia-h200/README.md). Update n+1 is handed n's states and donates them, so what is
published is a `PolicyCopy` a program made from n's resulting states right after n was
dispatched, never the states themselves; its device-to-host copy starts as it is made.

The policies of a strategy step, a restore or the final update are published as soon as they
are made (`finish`). Work that must see finished updates (a strategy step, a snapshot, a
checkpoint, the progress line) waits for the one in flight first (`wait`), so its seconds
are its own in the time breakdown. Where a run spans several processes, every program this
module dispatches is dispatched at a point all of them reach together.
"""

from __future__ import annotations

from collections.abc import Callable

from fastpop.learn.policy_copy import PolicyCopy


class UpdatePipeline:
    """The learner's updates and the publication of their policies (module docstring)."""

    def __init__(self, learner, collection, clock, watch, check: Callable[[], None]):
        """`clock`: the run's `PhaseClock`; `watch`: its `PhaseWatch`; `check`: its stop check
        (made after each dispatch and wait: a stop asked for meanwhile, by a signal to the whole
        process group, is acted on before a worker is checked, and none is restarted)."""
        self.learner, self.collection, self.clock, self.watch = learner, collection, clock, watch
        self.check = check
        self.running: str | None = None  # the update in flight's phase name (None: none)
        # The newest copy made: of the newest update dispatched, or of the policies a strategy
        # step or a restore made since.
        self.latest: PolicyCopy | None = None
        self.updated = False  # whether the run has dispatched an update yet

    def start(self) -> None:
        """Dispatches an update, then publishes the policies of the states it started from
        (the update before it, done by then or next in the device's queue)."""
        learner = self.learner
        previous = self._unpublished()  # made before the update donates the states it reads
        with self.clock("update_dispatch"):
            phase = learner.update_phase(first=not self.updated)
            with self.watch.phase(phase):
                learner.update()
        self.updated, self.running = True, phase
        with self.clock("publish_copy"):
            self.latest = learner.policy_copy()  # queued behind the update
        self.check()
        if previous is not None:
            self._publish(previous)

    def can_start(self) -> bool:
        """The learner's `can_update` (which reads the replay's sizes from the device until
        every buffer holds a transition), timed with the dispatch."""
        with self.clock("update_dispatch"):
            return self.learner.can_update()

    def wait(self, check: bool = True) -> None:
        """Until the update in flight is done (its policies not yet published); `check`: the
        stop check after it (not while the run stops: its checkpoint waits here)."""
        if self.running is None:
            return
        with self.clock("update_wait"), self.watch.phase(self.running):
            self.learner.wait_for_update()
        self.running = None
        if check:
            self.check()

    def finish(self) -> None:
        """Waits for the update in flight, then publishes the learner's current policies where
        the collection acts with others."""
        self.wait()
        if (copy := self._unpublished()) is not None:
            self._publish(copy)

    def publish_if_done(self) -> bool:
        """Publishes the newest update's policies if that update is done and the collection
        acts with others, without waiting for it (a pass that dispatches no update); whether
        it published them."""
        copy = self.latest
        if copy is None or not self.collection.publishes_to(copy.version) or not copy.ready():
            return False
        self.running = None  # its update is done
        self._publish(copy)
        return True

    def current(self) -> PolicyCopy:
        """A copy of the learner's current policies: the newest update's, unless a strategy
        step or a restore changed them since (a new one, then)."""
        if self.latest is None or self.latest.version != self.learner.policy_version:
            with self.clock("publish_copy"):
                self.latest = self.learner.policy_copy()
        return self.latest

    def _unpublished(self) -> PolicyCopy | None:
        """`current()`, where the collection acts with other policies (else None)."""
        if not self.collection.publishes_to(self.learner.policy_version):
            return None  # device mode, or sent already: no copy made
        return self.current()

    def _publish(self, copy: PolicyCopy) -> None:
        """`copy` to the collection: the wait for its update, the rest of its device-to-host
        copy and the write, each timed apart."""
        with self.clock("update_wait"):
            copy.wait()
        with self.clock("publish_copy"):
            self.learner.host_policy_tree(copy)  # kept by the copy for the write
        with self.clock("publish_write"):
            self.collection.publish(self.learner, copy)

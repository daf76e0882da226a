"""The learner's calls of its population update: compiled ahead, counted.

Process mode compiles the update's programs in a thread from the shapes of the learner's arrays
while the collectors start and step their warm-up (`compile_ahead`); the first call waits for
that compile (`wait_for_ahead`), and the progress line says what a call waits for (`phase`).
Every call is `record`ed: the learner's own, and device mode's inside its chunk programs
(fastpop.collect.chunk_programs). `update` is the learner's `Training.update`, `arguments` what
it is called with: states, replay buffers, member hparams, key.
"""

from __future__ import annotations

from concurrent.futures import Future

import jax

from fastpop.compilation.background import in_background


class UpdateCalls:
    """The update calls of a learner (module docstring): `updates` per member so far, and the
    latest call's metrics."""

    def __init__(self, mesh, updates_per_call: int):
        self.mesh = mesh  # None: one device
        self.updates_per_call = updates_per_call
        self.updates = 0
        # The latest call's metrics, device arrays read only when logged
        # (`Learner.last_metrics`).
        self.metrics: dict | None = None
        self.ahead: Future | None = None  # `compile_ahead`'s

    def compile_ahead(self, update, *arguments) -> None:
        """`update`'s programs compiled in a thread from the arguments' shapes; the first call
        waits for it. One over a mesh, or whose compile here failed, compiles at its call."""
        compile_ahead = getattr(update, "compile_ahead", None)  # the executors' (chunks)
        if compile_ahead is None and hasattr(update, "lower"):  # jitted: CEM-RL's, DvD's
            compile_ahead = lambda *shapes: update.lower(*shapes).compile()
        if compile_ahead is None or self.mesh is not None:
            return
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arguments)
        # Its failure is left to the first update's own compile, which raises it.
        self.ahead = in_background(compile_ahead, *shapes)

    def phase(self, first: bool, update, states, buffers, member_hparams, key) -> str:
        """What the progress line calls the next call (`first`: the run's first), which may
        wait for more than the update itself: see `_first_phase`; a later one, on a CPU, for
        the members per chunk measured (fastpop.population.chunking)."""
        if first:
            return self._first_phase(update, states, buffers, member_hparams, key)
        measures_again = getattr(update, "measures_again", None)
        if measures_again is not None and measures_again(member_hparams):
            return "population update (measuring members per chunk on this CPU)"
        return "population update"

    def _first_phase(self, update, *arguments) -> str:
        """What the progress line calls the first call, which waits for more than the others:
        its programs' compile (where none was made ahead, or it is still running) or, on a CPU,
        the measurement of its members per chunk (fastpop.population.chunking)."""
        ahead = self.ahead
        candidates = getattr(update, "chunks_ahead", None)  # the executors' chunk sizes
        if candidates is not None and self.mesh is None and len(candidates(*arguments)) > 1:
            return "first population update (measuring members per chunk on this CPU)"
        if ahead is None or (ahead.done() and ahead.exception() is not None):
            return "first population update (compiling)"  # none ahead, or it failed
        if not ahead.done():
            return "first population update (compiling, started during the warm-up)"
        return "first population update"

    def wait_for_ahead(self) -> None:
        """Before a call: its programs are the ones `compile_ahead` makes."""
        if self.ahead is not None:
            self.ahead.exception()  # waits; an error is raised by the call's own compile
            self.ahead = None

    def record(self, calls: int, metrics: dict) -> None:
        """`calls` made (by the learner, or by device mode's chunk programs); `metrics`: the
        last one's."""
        self.updates += calls * self.updates_per_call
        if calls:
            self.metrics = metrics  # read (a device-to-host copy) only when logged

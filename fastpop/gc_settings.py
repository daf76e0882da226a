"""Python's cyclic garbage collector set for fastpop's own processes, which import and trace JAX.

Importing JAX, flax and brax and tracing a program make hundreds of thousands of Python objects,
nearly all freed by reference counting. CPython's default collects its youngest generation every
700 net allocations, and every tenth of those collections walks the next generation up: on the
2-core CPU that was ~0.5 s of the 2.3 s it takes to trace the brax preset's chunk program and
~0.3 s of importing brax (results/startup/README.md, "The garbage collector"). The command line
(`python -m fastpop`, the `fastpop` script) and the collector and evaluator processes call
`tune_for_tracing` first; importing fastpop as a library changes nothing.
"""

from __future__ import annotations

import gc

# Net allocations between collections of the youngest generation (CPython's default: 700).
# Garbage in reference cycles lives that much longer; nothing in a run's loop relies on it.
YOUNGEST_THRESHOLD = 50_000


def tune_for_tracing() -> None:
    """Collect the youngest generation every `YOUNGEST_THRESHOLD` net allocations (unless this
    process already collects less often). Nothing is frozen: `gc.freeze` measured no faster
    and would keep any garbage alive then for good."""
    youngest, middle, oldest = gc.get_threshold()
    if 0 < youngest < YOUNGEST_THRESHOLD:  # (0: automatic collection turned off)
        gc.set_threshold(YOUNGEST_THRESHOLD, middle, oldest)

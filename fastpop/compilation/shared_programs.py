"""Builders of jitted programs shared by equal inputs: `shared(builder)` returns the very same
result for equal, hashable arguments, so two learners of one configuration in a process (a
resumed run beside an uninterrupted one, a sweep's runs, a test's two sides) share their jitted
functions, and JAX traces, lowers and loads each program once rather than once per learner.

Sound because what is built is pure: an agent's functions, a member's update loop, a jit of it.
Agents are equal only where they are the same object (their fields are functions), so
`fastpop.agents.make_agent` is shared too: equal (algorithm, env spec, config) give one agent.
Arguments that cannot be hashed build afresh, as before."""

from __future__ import annotations

import functools
from collections.abc import Callable

# Results kept per builder: enough for the configurations one process builds (a sweep's, the
# test suite's in one worker); the least recently used goes first.
KEPT = 128


def shared(builder: Callable) -> Callable:
    """`builder`, memoized on its (hashable, equal) arguments."""
    cached = functools.lru_cache(maxsize=KEPT)(builder)

    @functools.wraps(builder)
    def build(*args, **kwargs):
        try:
            hash((args, tuple(kwargs.items())))
        except TypeError:  # an unhashable argument: nothing to share it by
            return builder(*args, **kwargs)
        return cached(*args, **kwargs)

    return build

"""Programs that run once or rarely (the members' init, a strategy's initial arrays), compiled
for a short compile: `xla_defaults.RARELY_RUN`'s options (LLVM's O1), where a run waits for the
compile and the program's speed hardly matters."""

from __future__ import annotations

from collections.abc import Callable

import jax

from fastpop.xla_defaults import RARELY_RUN


def rarely_run_jit(fun: Callable) -> Callable:
    """`jax.jit(fun)` with `RARELY_RUN`'s compiler options when called at top level; called
    inside another program's trace (an `eval_shape`, a jitted caller: some argument is a
    tracer), a plain jit, traced as part of that program (JAX refuses options on a nested jit)."""
    compiled, traced = jax.jit(fun, compiler_options=RARELY_RUN), jax.jit(fun)

    def call(*args):
        inside = any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(args))
        return (traced if inside else compiled)(*args)

    return call

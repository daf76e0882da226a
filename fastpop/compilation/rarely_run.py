"""Programs that run once or rarely (the members' init, a strategy's initial arrays), compiled
for a short compile: `xla_defaults.RARELY_RUN`'s options (LLVM's O1), where a run waits for the
compile and the program's speed hardly matters. Where JAX is told to skip most optimizations
(`jax_disable_most_optimizations`, e.g. JAX_DISABLE_MOST_OPTIMIZATIONS=1), that asks for less
and wins, as a user's XLA_FLAGS win over fastpop's defaults."""

from __future__ import annotations

from collections.abc import Callable

import jax

from fastpop.xla_defaults import RARELY_RUN


def rarely_run_jit(fun: Callable, **jit_options) -> Callable:
    """`jax.jit(fun, **jit_options)` with `RARELY_RUN`'s compiler options when called at top
    level; called inside another program's trace (an `eval_shape`, a jitted caller), a plain
    jit, traced as part of that program (JAX refuses options on a nested jit)."""
    compiled = jax.jit(fun, compiler_options=RARELY_RUN, **jit_options)
    traced = jax.jit(fun, **jit_options)

    def call(*args):
        # Inside a trace an operation's result is a tracer (JAX stages all of them), whatever
        # the arguments; outside, this one returns a Python scalar: no program, no dispatch.
        inside = isinstance(jax.lax.stop_gradient(0.0), jax.core.Tracer)
        plain = inside or jax.config.read("jax_disable_most_optimizations")
        return (traced if plain else compiled)(*args)

    return call

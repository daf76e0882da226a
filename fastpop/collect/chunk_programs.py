"""Device mode's two compiled programs per chunk: `collect` makes the chunk's rows and inserts
them into the replay; `update` runs the update calls they allow. Called one after the other,
with no host work between (JAX queues the second behind the first), every array staying on
the device.

Two programs, not one: XLA compiles them at once in two threads, and the second is traced while
the first compiles; a chunk without update calls (the warm-up's) does not call the second. The
brax pendulum preset's chunk was compiled 9.5-12.0 s after its trace began as one program,
7.7-8.5 s as two (results/startup/README.md, "Two programs per chunk"). On the CPU the collect
program compiles with `xla_defaults.ENV_STEPPING` (no fusion emitters: about half the compile of
an env's step), the update with XLA's defaults (its MLPs ran ~10% slower without them).

Built here, above the learner, from the functions the learner exposes (its `Training`'s update,
its replay's `add_rows`) and the device collection's rollout; the learner's arrays go in and come
out as arguments (`Learner.device_state`, `Learner.adopt_chunk`), so neither side reaches into
the other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fastpop.compilation import stored_programs
from fastpop.learn.learner import ChunkPlan, DeviceState
from fastpop.learn.update_protocol import Training
from fastpop.xla_defaults import env_stepping_options

# rollout(lanes, key, states, hparams, env_steps (P,), restarts (P,)) -> (lanes, rows)
Rollout = Callable


class ChunkPrograms(NamedTuple):
    """collect(lanes, buffers, states, key, hparams, plan) -> (lanes, buffers), env lanes and
    buffers donated; update(buffers, states, key, member_hparams, plan) -> (states, key,
    metrics), states donated. Each a `jax.jit` (or a `stored_programs.StoredJit`)."""

    collect: Callable
    update: Callable

    def __call__(self, lanes, learner: DeviceState, collect_key, plan: ChunkPlan):
        """One chunk: its rows made with the states as they are before its updates (what
        process mode's collectors do with the last published params) and inserted, then
        `plan.calls` update calls. Returns (lanes, learner state, metrics: the last call's;
        None where the plan has no call: the update program is not called then, so a run's
        warm-up does not wait for its compile)."""
        buffers, states, key, hparams, member_hparams = learner
        lanes, buffers = self.collect(lanes, buffers, states, collect_key, hparams, plan)
        metrics = None
        if plan.calls:  # a host number: no wait for the device
            states, key, metrics = self.update(buffers, states, key, member_hparams, plan)
        return lanes, DeviceState(buffers, states, key, hparams, member_hparams), metrics

    def _cache_size(self) -> int:
        """Compiled variants of both (benchmarks and tests check nothing recompiles)."""
        return self.collect._cache_size() + self.update._cache_size()


def update_calls(training: Training, buffers, states, key, member_hparams, plan: ChunkPlan):
    """`plan.calls` update calls, their keys split from the learner's as `Learner.update` splits
    them, so the numbers equal the same calls made one at a time."""
    # Jitted so that the metrics' shapes and the loop share one trace of the update (~0.7 s
    # of a cold brax start's tracing each).
    update = jax.jit(training.update)

    def one_call(_, carry):
        states, key, _ = carry
        key, update_key = jax.random.split(key)
        states, metrics = update(states, buffers, member_hparams, update_key)
        return states, key, metrics

    shapes = jax.eval_shape(update, states, buffers, member_hparams, key)[1]
    metrics = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)
    return jax.lax.fori_loop(0, plan.calls, one_call, (states, key, metrics))


def chunk_programs(
    training: Training,
    add_rows: Callable,
    rollout: Rollout,
    placement=None,
    identity: str | None = None,
) -> ChunkPrograms:
    """The two programs of a chunk. `placement`: the shardings of (lanes, buffers, states) over
    a mesh, kept by the outputs (left free, XLA splits a shared replay over the devices, which
    every sample would then gather); None on one device. `identity`: what decides the
    programs, to keep them traced on disk (fastpop.compilation.stored_programs: one device's
    programs only); None: not kept."""
    lanes_at, buffers_at, states_at = placement or (None, None, None)

    def collect_chunk(lanes, buffers, states, key, hparams, plan):
        lanes, rows = rollout(lanes, key, states, hparams, plan.env_steps, plan.restarts)
        buffers = add_rows(buffers, rows, plan.joins)
        if placement is not None:
            lanes, buffers = jax.lax.with_sharding_constraint(
                (lanes, buffers), (lanes_at, buffers_at)
            )
        return lanes, buffers

    def chunk_updates(buffers, states, key, member_hparams, plan):
        states, key, metrics = update_calls(training, buffers, states, key, member_hparams, plan)
        if placement is not None:
            states = jax.lax.with_sharding_constraint(states, states_at)
        return states, key, metrics

    return ChunkPrograms(
        stored_programs.stored_jit(
            collect_chunk,
            identity,
            "collect",
            donate_argnums=(0, 1),
            compiler_options=env_stepping_options(),  # CPU: not for the update (runs slower)
        ),
        stored_programs.stored_jit(chunk_updates, identity, "update", donate_argnums=(1,)),
    )


def placed_arguments(lanes, learner: DeviceState) -> tuple:
    """(lanes, learner state, collect key, plan) as shapes of `lanes` and `learner` (shapes or
    arrays), committed to the default device as a chunk's call commits them
    (`stored_programs.committed`): what the programs are lowered for ahead of the first chunk."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    lanes, learner = jax.tree.map(placed, (lanes, learner))
    key = placed(jax.eval_shape(lambda: jax.random.key(0)))
    size = jax.tree.leaves(learner.hparams)[0].shape[0]
    return lanes, learner, key, ChunkPlan.template(size)


def lowerings(programs: ChunkPrograms, lanes, learner: DeviceState) -> Iterator:
    """`programs`' collect, then update (one device), lowered for `placed_arguments`: once
    compiled, the first chunk finds them compiled. Lowered one at a time, so that the caller
    compiles the first while the second is traced."""
    lanes, learner, key, plan = placed_arguments(lanes, learner)
    buffers, states, learner_key, hparams, member_hparams = learner
    yield programs.collect.lower(lanes, buffers, states, key, hparams, plan)
    yield programs.update.lower(buffers, states, learner_key, member_hparams, plan)

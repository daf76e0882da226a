"""Device mode's chunk: its two compiled programs over the learner's `LearnerState`, and
`run_chunk`, one chunk between the learner's `begin_device_chunk` (the host's plan) and
`end_device_chunk` (the state adopted, the calls counted).

The two programs: `collect` makes the chunk's rows (fastpop.collect.device_rollout's
`member_rollout`) and inserts them into the replay; `update` runs the update calls they allow.
Called one after the other, with no host work between (JAX queues the second behind the first),
every array staying on the device.

Two programs, not one: XLA compiles them at once in two threads, and the second is traced while
the first compiles; a chunk without update calls (the warm-up's) does not call the second. The
brax pendulum preset's chunk was compiled 9.5-12.0 s after its trace began as one program,
7.7-8.5 s as two (results/startup/README.md, "Two programs per chunk"). On the CPU the collect
program compiles with `xla_defaults.ENV_STEPPING` (no fusion emitters: about half the compile of
an env's step), the update with XLA's defaults (its MLPs ran ~10% slower without them).

Built here, above the learner, from the pure functions process mode's learner calls too
(`learner_state.update_calls` runs `update_call` K times; the replay's `add_rows` is its insert
as a pure function), traced from the shapes of `learner_state.init_state`
(`learner.chunk_program_inputs`) while the learner is made.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import NamedTuple

import jax

from fastpop.compilation import stored_programs
from fastpop.learn import learner_state
from fastpop.learn.learner import Learner
from fastpop.learn.learner_state import ChunkPlan, LearnerState
from fastpop.learn.update_protocol import Training
from fastpop.xla_defaults import env_stepping_options

# rollout(lanes, key, states, hparams, env_steps (P,), restarts (P,)) -> (lanes, rows)
Rollout = Callable


class ChunkPrograms(NamedTuple):
    """collect(lanes, buffers, states, key, hparams, plan) -> (lanes, buffers), env lanes and
    buffers donated; update(buffers, states, key, member_hparams, plan) -> (states, key,
    metrics), states donated. Each a `jax.jit` (or a `stored_programs.StoredJit`).
    `update_compile`: the update program's compile started ahead, if any (`run_chunk` waits for
    it before the first chunk with update calls)."""

    collect: Callable
    update: Callable
    update_compile: Future | None = None

    def __call__(self, lanes, learner: LearnerState, collect_key, plan: ChunkPlan):
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
        return lanes, LearnerState(buffers, states, key, hparams, member_hparams), metrics

    def _cache_size(self) -> int:
        """Compiled variants of both (benchmarks and tests check nothing recompiles)."""
        return self.collect._cache_size() + self.update._cache_size()


def run_chunk(
    programs: ChunkPrograms,
    learner: Learner,
    lanes,
    collect_key,
    lanes_per_member: int,
    commit: bool,
):
    """One chunk of every lane over `learner`'s state: planned, its rows made and inserted and
    the updates they allow run by `programs`, and the learner adopting the result. `commit`:
    the arguments committed to the default device first, as `lowerings` compiled them (one
    device). Returns the env lanes after the chunk."""
    state = learner.state
    plan = learner.begin_device_chunk(lanes_per_member)
    if plan.calls and programs.update_compile is not None:
        # Compiled ahead (where that failed, the call compiles it again and raises there).
        programs.update_compile.exception()
    args = (lanes, state, collect_key, plan)
    if commit:
        args = stored_programs.committed(args)
    lanes, state, metrics = programs(*args)
    learner.end_device_chunk(state, plan, metrics)
    return lanes


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
        state = LearnerState(buffers, states, key, None, member_hparams)
        state, metrics = learner_state.update_calls(training, state, plan)
        states, key = state.states, state.key
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


def placed_arguments(lanes, learner: LearnerState) -> tuple:
    """(lanes, learner state, collect key, plan) as shapes of `lanes` and `learner` (shapes or
    arrays), committed to the default device as a chunk's call commits them
    (`stored_programs.committed`): what the programs are lowered for ahead of the first chunk."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    lanes, learner = jax.tree.map(placed, (lanes, learner))
    key = placed(jax.eval_shape(lambda: jax.random.key(0)))
    size = jax.tree.leaves(learner.hparams)[0].shape[0]
    return lanes, learner, key, ChunkPlan.template(size)


def lowerings(programs: ChunkPrograms, lanes, learner: LearnerState) -> Iterator:
    """`programs`' collect, then update (one device), lowered for `placed_arguments`: once
    compiled, the first chunk finds them compiled. Lowered one at a time, so that the caller
    compiles the first while the second is traced."""
    lanes, learner, key, plan = placed_arguments(lanes, learner)
    buffers, states, learner_key, hparams, member_hparams = learner
    yield programs.collect.lower(lanes, buffers, states, key, hparams, plan)
    yield programs.update.lower(buffers, states, learner_key, member_hparams, plan)

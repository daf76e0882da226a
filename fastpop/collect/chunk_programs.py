"""Device mode's chunk, in one place: what the host fixes before it (`plan_chunk`), the
learner's arrays its programs take (`device_state`), its two compiled programs, and the learner
after them (`adopt_chunk`); `run_chunk` is one chunk of all of these.

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

Built here, above the learner, from what the learner exposes (its `Training`'s update, its
replay's `add_rows`, its counters and arrays); the learner has no device-mode code of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.compilation import stored_programs
from fastpop.learn.learner import Learner, LearnerParts
from fastpop.learn.update_protocol import Training
from fastpop.types import PRNGKey, PyTree
from fastpop.xla_defaults import env_stepping_options

# rollout(lanes, key, states, hparams, env_steps (P,), restarts (P,)) -> (lanes, rows)
Rollout = Callable


class DeviceState(NamedTuple):
    """The learner's device arrays the chunk's programs read and return."""

    buffers: Any
    states: Any
    key: PRNGKey
    hparams: PyTree
    member_hparams: Any


class ChunkPlan(NamedTuple):
    """The host's part of one device-mode chunk, fixed before its program runs."""

    env_steps: np.ndarray  # (P,) int32: env steps of each member's trial before the chunk,
    # what its exploration (warm-up, epsilon) acts at
    joins: np.ndarray  # (P,) bool: members whose buffer was just copied
    calls: np.int32  # update calls the chunk's rows allow
    restarts: np.ndarray  # (P,) bool: members whose fresh trial's rows start with this chunk
    # (their env lanes start new episodes)

    @classmethod
    def template(cls, size: int) -> ChunkPlan:
        """A plan of `size` members (its values unused: what a program is traced for)."""
        return cls(
            np.zeros(size, np.int32), np.zeros(size, bool), np.int32(0), np.zeros(size, bool)
        )


def plan_chunk(learner: Learner, lanes_per_member: int) -> ChunkPlan:
    """Records in `learner` the insert of the next chunk of rows (made on the device) and fixes
    what its program needs: the env steps before it, the join marks (cleared here) and the
    update calls the rows allow (`InProgramLimiter.calls_due`)."""
    limiter, clocks = learner.limiter, learner.clocks
    env_steps = clocks.trial_steps(limiter.inserted).astype(np.int32)
    restarts = clocks.restarting()
    joins = learner.replay.take_joins()
    before = limiter.inserted
    limiter.record_insert()
    clocks.record_rows(np.ones(learner.size, bool), before)  # made for the current trials
    rows_per_lane = (limiter.inserted - limiter.refill_from) // lanes_per_member
    calls = limiter.calls_due() if rows_per_lane >= 2 else 0  # a transition is two rows
    return ChunkPlan(env_steps, joins, np.int32(calls), restarts)


def device_state(learner: Learner) -> DeviceState:
    """The arrays a chunk's programs take (buffers, states and key are donated to them)."""
    return DeviceState(
        learner.replay.buffers, learner.states, learner.key, learner.hparams, learner.member_hparams
    )


def adopt_chunk(learner: Learner, state: DeviceState, plan: ChunkPlan, metrics: dict) -> None:
    """`learner` after a chunk's programs: its buffers, states and key, its update calls
    counted, their metrics (the last call's) kept and a policy version counted if any."""
    learner.replay.buffers, learner.states, learner.key = state.buffers, state.states, state.key
    calls = int(plan.calls)
    learner.limiter.record_calls(calls)
    learner.calls.record(calls, metrics)
    if calls:
        learner.policy_version += 1


def chunk_program_inputs(parts: LearnerParts) -> tuple:
    """(add_rows, the `DeviceState`'s shapes) of the learner `parts` make, without making it:
    nothing allocated or compiled (device mode traces its chunk programs from them while the
    learner initialises: `DeviceCollection.make_ahead`). One device."""
    made = []

    def state() -> DeviceState:
        learner = Learner(parts)
        made.append(learner.replay.add_rows)  # a pure function of its layout: no array held
        return device_state(learner)

    shapes = jax.eval_shape(state)
    return made[0], shapes


class ChunkPrograms(NamedTuple):
    """collect(lanes, buffers, states, key, hparams, plan) -> (lanes, buffers), env lanes and
    buffers donated; update(buffers, states, key, member_hparams, plan) -> (states, key,
    metrics), states donated. Each a `jax.jit` (or a `stored_programs.StoredJit`).
    `update_compile`: the update program's compile started ahead, if any (`run_chunk` waits for
    it before the first chunk with update calls)."""

    collect: Callable
    update: Callable
    update_compile: Future | None = None

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
    state = device_state(learner)
    plan = plan_chunk(learner, lanes_per_member)
    if plan.calls and programs.update_compile is not None:
        # Compiled ahead (where that failed, the call compiles it again and raises there).
        programs.update_compile.exception()
    args = (lanes, state, collect_key, plan)
    if commit:
        args = stored_programs.committed(args)
    lanes, state, metrics = programs(*args)
    adopt_chunk(learner, state, plan, metrics)
    return lanes


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

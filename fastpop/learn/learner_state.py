"""The learner's device state as one pytree, and the pure functions both collection modes call.

    init_state(training, layout, hparams, seed) -> (LearnerState, strategy state)
    update_call(training, state) -> (state, metrics)          one update call
    update_calls(training, state, plan) -> (state, metrics)   `plan.calls` of them, in a program

Process mode's `Learner` calls `init_state` and `update_call` eagerly, one call at a time;
device mode traces its chunk programs from `jax.eval_shape` of `init_state` and runs
`update_calls` inside them (fastpop.collect.chunk_programs). The same functions, so the same
numbers: a chunk's K calls split their keys from the learner's exactly as K calls of
`Learner.update` do. The host's counters around them (rate limiter, trial clocks, update calls,
policy version) are `fastpop.learn.bookkeeping`'s.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.learn.update_protocol import Training
from fastpop.types import PRNGKey, PyTree


class LearnerState(NamedTuple):
    """Every device array a learner holds (its strategy's state aside)."""

    buffers: Any  # the replay's buffers, in its layout (fastpop.learn.replay_store)
    states: Any  # the members' agent states, in the training's layout
    key: PRNGKey
    hparams: PyTree  # every member's hparams, stacked
    member_hparams: Any  # `hparams` as the training's update takes them (`Training.adopt`)


class ChunkPlan(NamedTuple):
    """The host's part of one device-mode chunk, fixed before its programs run
    (`Learner.begin_device_chunk`)."""

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


def init_agents(training: Training, hparams: PyTree, seed: int) -> tuple:
    """(states, key, member_hparams, strategy state): the members made from `seed`."""
    key, init_key = jax.random.split(jax.random.key(seed))
    states, strategy_state = training.init(init_key, hparams)
    return states, key, training.adopt(hparams), strategy_state


def init_state(training: Training, empty_buffers, hparams: PyTree, seed: int) -> tuple:
    """(LearnerState, strategy state) of a fresh learner: `empty_buffers()` its replay (a
    `replay_store.Layout`'s `empty`). Pure: under `jax.eval_shape` it allocates nothing."""
    states, key, member_hparams, strategy_state = init_agents(training, hparams, seed)
    return LearnerState(empty_buffers(), states, key, hparams, member_hparams), strategy_state


def update_call(training: Training, state: LearnerState) -> tuple[LearnerState, dict]:
    """One update call of every member, its key split from the learner's."""
    key, update_key = jax.random.split(state.key)
    states, metrics = training.update(state.states, state.buffers, state.member_hparams, update_key)
    return state._replace(states=states, key=key), metrics


def update_calls(training: Training, state: LearnerState, plan: ChunkPlan):
    """`plan.calls` calls of `update_call` in one program (traced by its caller). Returns (state,
    metrics: the last call's, NaN where there was none)."""
    # Jitted so that the metrics' shapes and the loop share one trace of the update (~0.7 s
    # of a cold brax start's tracing each).
    jitted = training._replace(update=jax.jit(training.update))

    def one_call(_, carry):
        return update_call(jitted, carry[0])

    shapes = jax.eval_shape(functools.partial(update_call, jitted), state)[1]
    metrics = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)
    return jax.lax.fori_loop(0, plan.calls, one_call, (state, metrics))

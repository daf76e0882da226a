"""Device mode's one compiled program per chunk: the chunk's rows, their insert into the replay
and the update calls they allow.

Built here, above the learner, from the functions the learner exposes (its `Training`'s update,
its replay's `add_rows`) and the device collection's rollout; the learner's arrays go in and come
out as arguments (`Learner.device_state`, `Learner.adopt_chunk`), so neither side reaches into
the other.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fastpop.compilation import stored_programs
from fastpop.learn.learner import ChunkPlan, DeviceState
from fastpop.learn.update_protocol import Training

# rollout(lanes, key, states, hparams, env_steps) -> (lanes, rows)
Rollout = Callable


def fused_iteration(
    training: Training,
    add_rows: Callable,
    rollout: Rollout,
    lanes,
    learner: DeviceState,
    collect_key,
    plan: ChunkPlan,
):
    """One chunk of device collection, its insert and `plan.calls` update calls as one
    program: `rollout` acts with the states as they are before this chunk's updates (what
    process mode's collectors do with the last published params). The update keys are split
    from the learner's key as `Learner.update` splits them, so the numbers equal the same calls
    made one at a time. Returns (lanes, learner state, metrics: the last call's, NaN when there
    was none)."""
    buffers, states, key, hparams, member_hparams = learner
    lanes, rows = rollout(lanes, collect_key, states, hparams, plan.env_steps)
    buffers = add_rows(buffers, rows, plan.joins)
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
    states, key, metrics = jax.lax.fori_loop(0, plan.calls, one_call, (states, key, metrics))
    return lanes, DeviceState(buffers, states, key, hparams, member_hparams), metrics


def compile_fused(
    training: Training,
    add_rows: Callable,
    rollout: Rollout,
    placement=None,
    identity: str | None = None,
):
    """`fused_iteration` jitted, with the env lanes and the learner's buffers, states and key
    donated (hparams are not: the learner keeps them). `placement`: the shardings of (lanes,
    buffers, states) over a mesh, kept by the outputs (left free, XLA splits a shared replay
    over the devices, which every sample would then gather); None on one device. `identity`:
    what decides the program, to keep it traced on disk (fastpop.compilation.stored_programs:
    one device's programs only); None: not kept."""

    def program(lanes, buffers, states, key, collect_key, hparams, member_hparams, plan):
        learner = DeviceState(buffers, states, key, hparams, member_hparams)
        lanes, learner, metrics = fused_iteration(
            training, add_rows, rollout, lanes, learner, collect_key, plan
        )
        if placement is not None:
            kept = (lanes, learner.buffers, learner.states)
            lanes, buffers, states = jax.lax.with_sharding_constraint(kept, placement)
            learner = learner._replace(buffers=buffers, states=states)
        return lanes, learner, metrics

    return stored_programs.stored_jit(program, identity, "fused", donate_argnums=(0, 1, 2))


def lower_for(program, lanes, learner: DeviceState):
    """`program` (`compile_fused`'s, one device) lowered for arguments of the shapes of `lanes`
    and `learner` (shapes or arrays), committed to the default device as `feed` commits them
    (`stored_programs.committed`): once compiled, the first chunk finds it compiled."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device)
    lanes, learner = jax.tree.map(placed, (lanes, learner))
    key = placed(jax.eval_shape(lambda: jax.random.key(0)))
    size = jax.tree.leaves(learner.hparams)[0].shape[0]
    plan = ChunkPlan.template(size)
    return program.lower(lanes, *learner[:3], key, *learner[3:], plan)

"""Population execution: the vectorized and sequential executors of a population's update.

A population is one pytree whose leaves carry a leading member axis (P, ...). The vectorized
executor updates it with ONE compiled program, jit(vmap(scan over K updates)); the sequential
executor jits the single-member program once and calls it per member from Python (the
paper's baseline). Both draw the same per-member keys, so for the same data they produce the
same states. On a CPU the vectorized program takes the population in chunks of members, sized
for that CPU (chunking.py): on accelerators it takes the whole population at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.agents.base import Agent
from fastpop.compilation.shared_programs import shared
from fastpop.population import chunked, chunking, replay
from fastpop.population.stacking import stack_in_one_program, unstack
from fastpop.types import PRNGKey, PyTree, Transition

# sample_batch(replay_state, key) -> Transition: draws one training batch inside the jit; with
# n-step returns it is called with a third argument, the member's own n (`replay.Sampler`).
SampleFn = Callable[..., Transition]

EXECUTIONS = ("vectorized", "sequential")


class UpdatePlan(NamedTuple):
    """What one call of a population's update does, whatever runs it (an executor, a sharded
    executor, a shared-critic strategy): `num_updates` (sample, update) steps of `agent` per
    member, each drawing its batch with `sample_batch` from one shared replay buffer or from
    the member's own (K > 1: a scan; K = 1: no loop at all, see `updates_per_program`)."""

    agent: Agent
    sample_batch: SampleFn
    num_updates: int
    shared_replay: bool = False
    fresh_wait: int = 0  # rows a member's own buffer must hold before it updates (halving's
    # fresh trials start with an empty one); 0: members update whenever the run does
    draws_once: bool = True  # draw the K steps' random numbers before the loop (same numbers)
    unroll: int = 1  # steps per iteration of the scan over K (XLA unrolls that many)


def image_agent_on_cpu(obs_shape: tuple[int, ...], obs_dtype) -> bool:
    """An Atari agent (uint8 frames) on a CPU: its K updates per call are K calls of a one-update
    program with no loop (`updates_per_program`), and a run updates its members one at a time
    on their own arrays, the sequential executor (`fastpop.run.parts.run_execution`).

    XLA:CPU runs convolutions inside a while loop about 13x slower than outside one (DQN's
    Nature CNN: 370 vs 28 ms per update, results/bench/README.md), and a scan, even of length 1,
    is a while loop: K updates unrolled in one program ran at full speed but took ~55 s to
    compile at K = 50. vmapped per-member convolutions run as grouped ones, at about half the
    speed, and members updated one at a time out of stacked arrays are copied out and back
    (once per call of K updates: `chunked.ChunkedUpdate.one_at_a_time`). The pong preset's
    update call (2 members x 50 updates, results/startup/update_call.py): 2.95 s after a first
    call of 64.5 s with K unrolled; 2.08 s after 4.1 s this way. MinAtar's float grids (device
    mode: the update inside one program per chunk) keep the rolled scan: 2x slower per update,
    but its 50 updates unrolled took 103 s to compile (gymnax/Breakout-MinAtar, population 2,
    this CPU).
    """
    on_cpu = jax.default_backend() == "cpu"
    return on_cpu and len(obs_shape) == 3 and np.dtype(obs_dtype) == np.uint8


def updates_per_program(obs_shape: tuple[int, ...], obs_dtype, num_updates: int) -> int:
    """How many of a call's K updates one compiled program makes (the call runs it K / that
    many times: `RepeatedUpdate`): 1 for `image_agent_on_cpu`, else all K in one scan."""
    return 1 if image_agent_on_cpu(obs_shape, obs_dtype) else num_updates


class RepeatedUpdate:
    """update(states, replay, hparams, key) -> (states, metrics (P, K)) as `calls` consecutive
    calls of `update`, which makes K / calls updates per member; call i gets key i of
    split(key, calls). Every other attribute (compile_ahead, chosen, ...) is `update`'s."""

    def __init__(self, update: Callable, calls: int):
        self.update, self.calls = update, calls

    def __call__(self, states, replay, hparams, key):
        call_keys = jax.random.split(key, self.calls)
        # A chunked update makes the calls itself: members updated one at a time make all
        # theirs in turn, each copied out of the stacked states once, not at every call.
        if isinstance(self.update, chunked.ChunkedUpdate):
            return self.update.repeat(states, replay, hparams, call_keys)
        return chunked.calls_in_turn(self.update, states, replay, hparams, call_keys)

    def __getattr__(self, name: str):
        if name == "update":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.update, name)


def repeated(update: Callable, calls: int) -> Callable:
    """`update` made `calls` times per call (itself when once)."""
    return update if calls == 1 else RepeatedUpdate(update, calls)


@shared
def member_update_loop(plan: UpdatePlan):
    """K consecutive (sample, update) steps of one member: one scan, or one step with no loop.

    Step i's random numbers come from split(split(key, K)[i]): (replay positions, the agent's
    draws). With `plan.draws_once` they are drawn for all K steps before the loop, one
    vectorized random-number program instead of one per step: the same numbers (the buffer
    does not change during a call), far fewer kernels (XLA:CPU rolls each threefry into a
    loop of its own)."""
    agent, sample_batch, num_updates = plan.agent, plan.sample_batch, plan.num_updates
    draws_once = plan.draws_once and hasattr(sample_batch, "positions")

    def run(state, buffer, hparams, key):
        own_n = replay.own_n_args(hparams, agent.n_step)
        step_keys = jax.vmap(jax.random.split)(jax.random.split(key, num_updates))
        if draws_once:
            positions = jax.vmap(sample_batch.positions, in_axes=(None, 0))(buffer, step_keys[:, 0])
            steps = (positions, jax.vmap(agent.draw)(step_keys[:, 1]))

            def one_update(state, step):
                positions, drawn = step
                batch = sample_batch.gather(buffer, positions, *own_n)
                return agent.update_drawn(state, batch, hparams, drawn)
        else:
            steps = step_keys

            def one_update(state, step_key):
                batch = sample_batch(buffer, step_key[0], *own_n)
                return agent.update(state, batch, hparams, step_key[1])

        if num_updates == 1:  # no loop: see `updates_per_program`
            updated, metrics = one_update(state, jax.tree.map(lambda x: x[0], steps))
            metrics = jax.tree.map(lambda m: m[None], metrics)
        else:
            updated, metrics = jax.lax.scan(one_update, state, steps, unroll=plan.unroll)
        if not plan.fresh_wait:
            return updated, metrics
        waits = ~replay.can_sample(buffer, plan.fresh_wait)
        keep = lambda old, new: jnp.where(waits, old, new)
        unmeasured = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan, jnp.float32), metrics)
        return jax.tree.map(keep, state, updated), jax.tree.map(keep, unmeasured, metrics)

    return run


class Executor(NamedTuple):
    """How a population's update runs.

    update(states, replay, hparams, key) -> (states, metrics with leaves (P, K))
    adopt(tree) / release(layout): convert a stacked population tree to the executor's own
    layout and back (identity for vectorized; a list of members for sequential, so that no
    member is sliced out of a stacked array on every call).
    """

    name: str
    update: Callable[[Any, Any, Any, PRNGKey], tuple[Any, dict]]
    adopt: Callable[[PyTree], Any]
    release: Callable[[Any], PyTree]


def default_members_per_chunk() -> int | None:
    """Members vmapped together on this backend when nothing is measured (None: the whole
    population): accelerators take the whole population at once; on a CPU `make_executor`
    measures the chunk size (chunking.py) and falls back to this rule of thumb only when
    told to (FASTPOP_MEMBERS_PER_CHUNK=rule).

    On a CPU a population's activations quickly outgrow the caches (TD3 at P=32: 8 MiB per
    256-wide layer), and the memory-bound parts of the update then cost more than the batched
    matmuls save, so members are vmapped in cache-sized chunks, run one after another. Which
    size is best differs between CPUs (results/bench/README.md), hence the measurement.
    """
    return 8 if jax.default_backend() == "cpu" else None


def vectorized(plan: UpdatePlan, members_per_chunk: int | None = None) -> Executor:
    """jit(vmap(scan)): one compiled program updates every member; states are donated.

    With `members_per_chunk` below the population size, one compiled program vmaps a chunk of
    members and is called once per chunk, updating the stacked population in place (same
    numbers; see `default_members_per_chunk`). A chunk of one member runs the member's own
    (unbatched) program: P = 1 compiles to the sequential one.
    """
    member_loop = member_update_loop(plan)
    replay_axis = None if plan.shared_replay else 0
    identity = lambda tree: tree
    if members_per_chunk is None:
        update = chunked.whole_population(member_loop, replay_axis)
    else:
        update = chunked.ChunkedUpdate(member_loop, replay_axis, members_per_chunk)
    return Executor("vectorized", update, identity, identity)


def sequential(plan: UpdatePlan) -> Executor:
    """The single-member program jitted once and called per member from Python."""
    member_loop = jax.jit(member_update_loop(plan), donate_argnums=0)

    def update(states, replay, hparams, key):
        keys = jax.random.split(key, len(states))
        new_states, metrics = [], []
        for i, state in enumerate(states):
            member_replay = replay if plan.shared_replay else replay[i]
            state, member_metrics = member_loop(state, member_replay, hparams[i], keys[i])
            new_states.append(state)
            metrics.append(member_metrics)
        return new_states, stack_in_one_program(metrics)

    def compile_ahead(states, replay, hparams, key) -> None:
        """The member program compiled from the first member's shapes (none is run)."""
        member_replay = replay if plan.shared_replay else replay[0]
        member_loop.lower(states[0], member_replay, hparams[0], key).compile()

    update.compile_ahead = compile_ahead
    return Executor("sequential", update, unstack, stack_in_one_program)


def sequential_in_one_program(plan: UpdatePlan) -> Executor:
    """Members one after another inside one compiled program (`chunked.members_in_turn`): the
    sequential executor without its Python loop; the same keys, the same numbers."""
    update = chunked.members_in_turn(member_update_loop(plan), None if plan.shared_replay else 0)
    identity = lambda tree: tree
    return Executor("sequential-in-one-program", update, identity, identity)


def tuned(plan: UpdatePlan) -> Executor:
    """The vectorized executor with its members per chunk chosen for this CPU, per population
    size on first use (measured, cached; see chunking.py). Same numbers as `vectorized`."""
    agent, shared_replay = plan.agent, plan.shared_replay
    member_loop = member_update_loop(plan)
    replay_axis = None if shared_replay else 0

    def describe(states, replay, hparams, key):
        member_replay = replay if shared_replay else chunking.abstract_member(replay)
        keys = jax.eval_shape(lambda k: jax.random.split(k, 1)[0], key)
        batch = jax.eval_shape(plan.sample_batch, member_replay, keys)
        args = (chunking.abstract_member(states), batch, chunking.abstract_member(hparams), keys)
        text = f"{agent.name} K={plan.num_updates} shared={shared_replay}"
        shapes = " ".join(map(chunking.shapes_text, args))
        # The members' init runs each of their networks once, so it shows any convolution the
        # update would run, and traces in ~1/20 of the update's time (~0.03 s against ~0.8 s
        # for a TD3 recipe update: a CPU run's start-up, and every learner a test builds).
        return text, shapes, chunking.has_convolutions(agent.init, keys, args[2])

    update = chunking.TunedUpdate(member_loop, replay_axis, describe, default_members_per_chunk())
    identity = lambda tree: tree
    return Executor("vectorized", update, identity, identity)


def make_executor(execution: str, plan: UpdatePlan) -> Executor:
    """The executor by name. Vectorized on an accelerator: the whole population in one program;
    on a CPU: `tuned` (members per chunk measured for this CPU)."""
    if execution == "vectorized":
        if jax.default_backend() != "cpu":
            return vectorized(plan)
        return tuned(plan)
    if execution == "sequential":
        return sequential(plan)
    if execution == "sequential-in-one-program":
        return sequential_in_one_program(plan)
    raise ValueError(f"unknown execution {execution!r}; choose one of {', '.join(EXECUTIONS)}")

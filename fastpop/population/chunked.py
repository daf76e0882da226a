"""Chunked programs: a population's update run c members at a time.

A chunk of c members is one compiled program, jit(vmap(scan)) over c members, called once per
chunk on the stacked population, which it updates in place (states donated): no loop around
the members inside the program (XLA:CPU runs convolutions inside loops very slowly), compile
time independent of the number of chunks. Chunks of one member run the member's own unbatched
program, the sequential executor's, on the member's state copied out of the stacked one and
back (`one_at_a_time`). How many members a chunk holds on a CPU is measured in
fastpop.population.chunking.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fastpop.compilation.shared_programs import shared
from fastpop.types import POP_AXIS


def chunk_size(size: int, members_per_chunk: int | None) -> int:
    """The largest divisor of `size` that is at most `members_per_chunk` (None: all)."""
    if members_per_chunk is None or members_per_chunk >= size:
        return size
    return max(d for d in range(1, members_per_chunk + 1) if size % d == 0)


@jax.jit
def copy_tree(tree):
    """A copy of every leaf (keeps a tree usable after a donating call consumed the original),
    as one compiled program per tree rather than one per leaf shape."""
    return jax.tree.map(jnp.copy, tree)


def population_size(tree) -> int:
    return jax.tree.leaves(tree)[0].shape[0]


@shared
def whole_population(member_loop, replay_axis):
    """jit(vmap(scan)) over the whole population (a population of one: the member program)."""
    batched = jax.vmap(member_loop, in_axes=(0, replay_axis, 0, 0), axis_name=POP_AXIS)

    def update(states, replay, hparams, key):
        size = population_size(hparams)
        keys = jax.random.split(key, size)
        if size > 1:
            return batched(states, replay, hparams, keys)
        one = lambda tree: jax.tree.map(lambda x: x[0], tree)
        member_replay = replay if replay_axis is None else one(replay)
        out = member_loop(one(states), member_replay, one(hparams), keys[0])
        return jax.tree.map(lambda x: x[None], out)

    return jax.jit(update, donate_argnums=0)


@shared
def members_in_turn(member_loop, replay_axis):
    """jit(lax.map): every member's K updates in ONE program, members one after another (the
    strongest sequential baseline: no Python dispatch per member, no batching across them)."""

    def update(states, replay, hparams, key):
        keys = jax.random.split(key, population_size(hparams))
        if replay_axis is None:
            one_member = lambda args: member_loop(args[0], replay, args[1], args[2])
            return jax.lax.map(one_member, (states, hparams, keys))
        return jax.lax.map(lambda args: member_loop(*args), (states, replay, hparams, keys))

    return jax.jit(update, donate_argnums=0)


@shared
def chunk_program(member_loop, replay_axis, chunk: int):
    """jit: members [index * chunk, (index + 1) * chunk) updated in place (states donated)."""
    batched = jax.vmap(member_loop, in_axes=(0, replay_axis, 0, 0), axis_name=POP_AXIS)

    def update_chunk(states, replay, hparams, keys, index):
        start = index * chunk
        take = lambda tree: jax.tree.map(
            lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk), tree
        )
        put = lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, start, 0)
        member_replay = replay if replay_axis is None else take(replay)
        new_states, metrics = batched(take(states), member_replay, take(hparams), take(keys))
        return jax.tree.map(put, states, new_states), metrics

    return jax.jit(update_chunk, donate_argnums=0)


@shared
def member_program(member_loop, replay_axis):
    """jit: one member's update on its own state (donated), as the sequential executor's
    program; its replay, hparams and key read out of the stacked ones inside the program (a
    buffer is sampled where it lies, never copied)."""

    def update_member(state, replay, hparams, keys, index):
        member_replay = replay if replay_axis is None else take_member(replay, index)
        return member_loop(state, member_replay, take_member(hparams, index), keys[index])

    return jax.jit(update_member, donate_argnums=0)


@jax.jit
def take_member(tree, index):
    """Member `index` of a stacked tree, as arrays of its own."""
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, index, keepdims=False), tree)


@functools.partial(jax.jit, donate_argnums=0)
def put_member(tree, member, index):
    """The stacked `tree` with member `index` set to `member`, in place (`tree` donated)."""
    put = lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, index, 0)
    return jax.tree.map(put, tree, member)


def calls_in_turn(update, states, replay, hparams, call_keys):
    """`update` called with each of `call_keys` in turn: (states, metrics (P, calls x K))."""
    metrics = []
    for key in call_keys:
        states, call_metrics = update(states, replay, hparams, key)
        metrics.append(call_metrics)
    return states, jax.tree.map(lambda *m: jnp.concatenate(m, axis=1), *metrics)


class ChunkedUpdate:
    """update(states, replay, hparams, key) -> (states, metrics (P, K)) in chunks of at most
    `members_per_chunk` members (None: the whole population in one program)."""

    def __init__(self, member_loop, replay_axis, members_per_chunk: int | None):
        self.members_per_chunk = members_per_chunk
        self.whole = whole_population(member_loop, replay_axis)
        self.member = member_program(member_loop, replay_axis)
        self.make_program = functools.partial(chunk_program, member_loop, replay_axis)
        self.programs: dict[int, Callable] = {}

    def chunk_for(self, states, replay, hparams, key) -> int:
        return chunk_size(population_size(hparams), self.members_per_chunk)

    def settled_chunk(self, states, replay, hparams, key) -> int | None:
        """The chunk size of every call from now on (None: it may change between calls)."""
        return self.chunk_for(states, replay, hparams, key)

    def __call__(self, states, replay, hparams, key):
        chunk = self.chunk_for(states, replay, hparams, key)
        return self.run(chunk, states, replay, hparams, key)

    def repeat(self, states, replay, hparams, call_keys):
        """The update called with each of `call_keys` in turn (`RepeatedUpdate`'s calls)."""
        if self.settled_chunk(states, replay, hparams, call_keys[0]) == 1:
            return self.one_at_a_time(states, replay, hparams, call_keys)
        return calls_in_turn(self, states, replay, hparams, call_keys)

    def run(self, chunk, states, replay, hparams, key, members: int | None = None):
        """Chunks of `chunk` members; with `members`, only the first that many (timing)."""
        size = population_size(hparams)
        if chunk == 1:
            return self.one_at_a_time(states, replay, hparams, key[None], members)
        if chunk == size:
            return self.whole(states, replay, hparams, key)
        program, keys, metrics = self._program(chunk), jax.random.split(key, size), []
        for index in range((members or size) // chunk):
            states, chunk_metrics = program(states, replay, hparams, keys, index)
            metrics.append(chunk_metrics)
        return states, jax.tree.map(lambda *m: jnp.concatenate(m), *metrics)

    def one_at_a_time(self, states, replay, hparams, call_keys, members: int | None = None):
        """Each member through all its calls (one per key of `call_keys`) in turn, as the
        sequential executor does, on arrays of its own: copied out of the stacked states and
        back once."""
        # Not one program per member and call that takes the member out and puts it back:
        # XLA:CPU copies it into a temporary buffer allocated afresh at every run (52 MiB for
        # DQN's Atari member at P = 4, against 16 MiB for the member's own program), and at one
        # update per program (Atari) those copies and page faults cost a third of the update.
        size = population_size(hparams)
        keys = [jax.random.split(key, size) for key in call_keys]  # per call: every member's
        metrics = []
        for index in range(members or size):
            state, calls = take_member(states, index), []
            for member_keys in keys:
                state, call_metrics = self.member(state, replay, hparams, member_keys, index)
                calls.append(call_metrics)
            states = put_member(states, state, index)
            metrics.append(jax.tree.map(lambda *m: jnp.concatenate(m), *calls))
        return states, jax.tree.map(lambda *m: jnp.stack(m), *metrics)

    def chunks_ahead(self, states, replay, hparams, key) -> list[int]:
        """The chunk sizes the first call may run (`compile_ahead` compiles them)."""
        return [self.chunk_for(states, replay, hparams, key)]

    def compile_ahead(self, states, replay, hparams, key) -> None:
        """The programs of the first call compiled now, from arguments of its shapes (shapes
        or arrays; none is run): the call then finds them compiled."""
        chunks = self.chunks_ahead(states, replay, hparams, key)
        self.compile_chunks(chunks, states, replay, hparams, key)

    def compile_chunks(self, chunks: list[int], states, replay, hparams, key) -> None:
        """The programs of chunks of each size in `chunks` compiled from `compile_ahead`'s
        arguments."""
        size = population_size(hparams)
        keys = jax.eval_shape(lambda k: jax.random.split(k, size), key)
        for chunk in chunks:
            if chunk == 1:
                state = jax.eval_shape(take_member, states, 0)
                take_member.lower(states, 0).compile()
                self.member.lower(state, replay, hparams, keys, 0).compile()
                put_member.lower(states, state, 0).compile()
            elif chunk == size:
                self.whole.lower(states, replay, hparams, key).compile()
            else:
                self._program(chunk).lower(states, replay, hparams, keys, 0).compile()

    def _program(self, chunk: int) -> Callable:
        """The program of chunks of `chunk` members, made at its first use."""
        if chunk not in self.programs:
            self.programs[chunk] = self.make_program(chunk)
        return self.programs[chunk]

    def _cache_size(self) -> int:
        """Compiled variants in use, like jax.jit's (tests check that nothing recompiles)."""
        programs = [self.whole, self.member, *self.programs.values()]
        return sum(program._cache_size() for program in programs)

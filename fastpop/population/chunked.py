"""Chunked programs: a population's update run c members at a time.

A chunk of c members is one compiled program, jit(vmap(scan)) over c members, called once per
chunk on the stacked population, which it updates in place (states donated): no loop around
the members inside the program (XLA:CPU runs convolutions inside loops very slowly), compile
time independent of the number of chunks, and a chunk of one member is the member's own
unbatched program, the sequential executor's. How many members a chunk holds on a CPU is
measured in fastpop.population.chunking.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

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


def chunk_program(member_loop, replay_axis, chunk: int):
    """jit: members [index * chunk, (index + 1) * chunk) updated in place (states donated)."""
    batched = jax.vmap(member_loop, in_axes=(0, replay_axis, 0, 0), axis_name=POP_AXIS)

    def update_chunk(states, replay, hparams, keys, index):
        start = index * chunk
        if chunk == 1:
            take = lambda tree: jax.tree.map(
                lambda x: jax.lax.dynamic_index_in_dim(x, start, keepdims=False), tree
            )
            put = lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, start, 0)
            run, out_metrics = member_loop, lambda m: jax.tree.map(lambda x: x[None], m)
        else:
            take = lambda tree: jax.tree.map(
                lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk), tree
            )
            put = lambda x, y: jax.lax.dynamic_update_slice_in_dim(x, y, start, 0)
            run, out_metrics = batched, lambda m: m
        member_replay = replay if replay_axis is None else take(replay)
        new_states, metrics = run(take(states), member_replay, take(hparams), take(keys))
        return jax.tree.map(put, states, new_states), out_metrics(metrics)

    return jax.jit(update_chunk, donate_argnums=0)


class ChunkedUpdate:
    """update(states, replay, hparams, key) -> (states, metrics (P, K)) in chunks of at most
    `members_per_chunk` members (None: the whole population in one program)."""

    def __init__(self, member_loop, replay_axis, members_per_chunk: int | None):
        self.members_per_chunk = members_per_chunk
        self.whole = whole_population(member_loop, replay_axis)
        self.make_program = functools.partial(chunk_program, member_loop, replay_axis)
        self.programs: dict[int, Callable] = {}

    def chunk_for(self, states, replay, hparams, key) -> int:
        return chunk_size(population_size(hparams), self.members_per_chunk)

    def __call__(self, states, replay, hparams, key):
        chunk = self.chunk_for(states, replay, hparams, key)
        return self.run(chunk, states, replay, hparams, key)

    def run(self, chunk, states, replay, hparams, key, members: int | None = None):
        """Chunks of `chunk` members; with `members`, only the first that many (timing)."""
        size = population_size(hparams)
        if chunk == size:
            return self.whole(states, replay, hparams, key)
        program, keys, metrics = self._program(chunk), jax.random.split(key, size), []
        for index in range((members or size) // chunk):
            states, chunk_metrics = program(states, replay, hparams, keys, index)
            metrics.append(chunk_metrics)
        return states, jax.tree.map(lambda *m: jnp.concatenate(m), *metrics)

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
            if chunk == size:
                self.whole.lower(states, replay, hparams, key).compile()
                continue
            self._program(chunk).lower(states, replay, hparams, keys, 0).compile()

    def _program(self, chunk: int) -> Callable:
        """The program of chunks of `chunk` members, made at its first use."""
        if chunk not in self.programs:
            self.programs[chunk] = self.make_program(chunk)
        return self.programs[chunk]

    def _cache_size(self) -> int:
        """Compiled variants in use, like jax.jit's (tests check that nothing recompiles)."""
        return sum(program._cache_size() for program in [self.whole, *self.programs.values()])

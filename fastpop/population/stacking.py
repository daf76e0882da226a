"""The member axis of a population: one pytree whose leaves carry a leading member axis
(P, ...). Members stacked and taken apart, gathered, copied in place and checked, and one
member's hparams broadcast to the population.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from fastpop.agents.base import hparam_dtype
from fastpop.types import PyTree


def stack(members: Sequence[PyTree]) -> PyTree:
    """[tree_0, ..., tree_{P-1}] -> one tree with leaves (P, ...)."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *members)


# `stack` as one program (outside a jit, `stack` compiles and dispatches one per leaf shape).
stack_in_one_program = jax.jit(stack)


# Up to this many members `unstack` is one program per tree (slicing leaf by leaf outside a
# jit compiles two small programs for every leaf shape). That program's compile grows faster
# than the population (TD3 states on a 2-core CPU: 1.4 s at 16 members against 0.6 s
# sliced, 66 s at 256 against 3 s).
UNSTACK_IN_ONE_PROGRAM_UP_TO = 8


def unstack(population: PyTree) -> list[PyTree]:
    """Inverse of `stack`."""
    size = population_size(population)
    if size <= UNSTACK_IN_ONE_PROGRAM_UP_TO:
        return _unstack_program(population)
    return [member(population, i) for i in range(size)]


@jax.jit
def _unstack_program(population: PyTree) -> list[PyTree]:
    return [member(population, i) for i in range(population_size(population))]


def member(population: PyTree, index: int) -> PyTree:
    return jax.tree.map(lambda leaf: leaf[index], population)


def gather(population: PyTree, indices: jax.Array) -> PyTree:
    """Member i of the result is member indices[i] of the input (PBT exploit, selection)."""
    return jax.tree.map(lambda leaf: jnp.take(leaf, indices, axis=0), population)


@functools.partial(jax.jit, donate_argnums=0)
def copy_member(population: PyTree, target: jax.Array, source: jax.Array) -> PyTree:
    """Member `target` overwritten by member `source`, in place (the population is donated):
    copying one replay buffer must not hold a second copy of every member's."""
    return jax.tree.map(lambda leaf: leaf.at[target].set(leaf[source]), population)


# Values one finiteness check reads at once, over all members: the leaves are concatenated into
# groups of at most this many (a transient copy of 64 MiB of float32), so a large population's
# check neither copies every member's state nor compiles one reduction per leaf.
FINITE_GROUP_VALUES = 1 << 24


@functools.partial(jax.jit, static_argnames="group_values")
def finite_members(population: PyTree, group_values: int = FINITE_GROUP_VALUES) -> jax.Array:
    """(P,) bool: every floating-point value of the member is finite. The leaves are checked a
    group at a time, each group concatenated into one (P, n) array: one reduction per group
    rather than per leaf compiles 2.3-3.7x faster (results/startup/finite_check_compile.py),
    and this program runs once per evaluation round."""
    rows = [
        leaf.reshape(leaf.shape[0], -1)
        for leaf in jax.tree.leaves(population)
        if jnp.issubdtype(leaf.dtype, jnp.inexact)
    ]
    per_member = max(1, group_values // population_size(population))
    checks = [
        jnp.all(jnp.isfinite(jnp.concatenate(group, axis=1)), axis=1)
        for group in _groups(rows, per_member)
    ]
    return jnp.all(jnp.stack(checks), axis=0)


def _groups(rows: list[jax.Array], elements: int) -> list[list[jax.Array]]:
    """`rows` ((P, n_i) each) in groups of one dtype and at most `elements` values per member
    (a larger leaf alone)."""
    groups: list[list[jax.Array]] = []
    for dtype in dict.fromkeys(row.dtype for row in rows):
        group, size = [], 0
        for row in (row for row in rows if row.dtype == dtype):
            if group and size + row.shape[1] > elements:
                groups.append(group)
                group, size = [], 0
            group.append(row)
            size += row.shape[1]
        groups.append(group)
    return groups


def population_size(population: PyTree) -> int:
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(population)}
    if len(sizes) != 1:
        raise ValueError(f"population leaves disagree on the member axis: sizes {sorted(sizes)}")
    return sizes.pop()


def broadcast_hparams(hparams: PyTree, size: int, **per_member: Sequence[float]) -> PyTree:
    """Stack `size` copies of one member's hparams, overriding fields with per-member values.

    broadcast_hparams(agent.default_hparams(), 3, actor_lr=[1e-4, 3e-4, 1e-3])
    """
    fields = hparams._asdict()
    unknown = set(per_member) - set(fields)
    if unknown:
        raise ValueError(f"unknown hparams {sorted(unknown)}; known: {sorted(fields)}")
    stacked = {}
    for name, value in fields.items():
        values = per_member.get(name)
        if values is None:  # an optional field left None stays None
            stacked[name] = None if value is None else jnp.broadcast_to(value, (size,))
        elif len(values) != size:
            raise ValueError(f"hparam {name!r} has {len(values)} values for {size} members")
        else:
            stacked[name] = jnp.asarray(values, hparam_dtype(value))
    return type(hparams)(**stacked)

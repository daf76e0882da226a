"""The run's replay buffers behind one interface, whatever their layout.

    shared    one buffer whose lanes are every member's environments (CEM-RL, DvD, or
              `replay.shared: true`)
    stacked   one buffer per member, stacked on a leading member axis (the vectorized executor)
    listed    one buffer per member, kept as a list (the sequential executor: slicing a stacked
              buffer per member and call would copy it)

`ReplayStore` inserts collected rows, hands the executors the buffers, samples them with the
run's one `replay.Sampler` (the one the executors draw with), copies members (PBT `replay:
copy`), saves and restores. Rows arrive member-major: lanes m*E .. m*E+E-1 are member m's E
environments. What differs between layouts is a `Layout` of functions, chosen once when the
store is made: no method asks which layout it has.

A copied buffer goes on receiving rows from its own member's environments, whose stream does
not continue the source's: the first row written after a copy is marked as an episode start, so
no sampled transition and no frame stack crosses the join (see `replay.sample`).

With a `mesh` (population.devices > 1, population/sharding.py) stacked buffers are split over its
devices by member, and each member's rows are put on the device that holds the member before
they are added; a shared buffer is replicated on every device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.compilation.background import in_background
from fastpop.population import replay, sharding
from fastpop.types import PRNGKey, Transition

LAYOUTS = ("shared", "stacked", "listed")


def layout_for(shared: bool, execution: str) -> str:
    if shared:
        return "shared"
    return "listed" if execution == "sequential" else "stacked"


class Layout(NamedTuple):
    """What one layout does with its buffers (`buffers`: a tree, or listed: a list of trees)."""

    empty: Callable[[], Any]  # new empty buffers where they live
    saved: Callable[[Any], Any]  # the buffers as a checkpoint holds them: stacked, or shared
    put: Callable[[Any], Any]  # `saved` buffers (host or device arrays) onto their device(s)
    insert: Callable[[Any, replay.Rows], Any]  # host rows added, compiled, buffers donated
    add: Callable[[Any, replay.Rows], Any]  # `insert` as a pure function, traced by its caller
    first: Callable[[Any], replay.ReplayState]  # the shared buffer, or member 0's
    sizes: Callable[[Any], jax.Array]  # rows per lane of every buffer
    copy: Callable[[Any, np.ndarray, list[int]], tuple[Any, list[int]]]
    # copy(buffers, sources, targets) -> (buffers, the targets whose buffer was copied)
    clear: Callable[[Any, np.ndarray], Any]  # clear(buffers, members): their buffers emptied
    # compile_insert(buffer shapes): `insert`'s program compiled for one chunk of rows, so that
    # the first insert finds it (one device only: on a mesh its placement decides too)
    compile_insert: Callable[[Any], None]
    name: str = ""  # one of `LAYOUTS` (`make_layout` names it)


def _emptied(buffer: replay.ReplayState, members) -> replay.ReplayState:
    """No rows to sample where `members` (stacked: a (P,) mask; one buffer: a bool): the old
    rows stay in memory, unreachable, and the next chunk is written from the lane's start."""
    zero = lambda counter: jnp.where(members, 0, counter).astype(counter.dtype)
    return buffer._replace(position=zero(buffer.position), size=zero(buffer.size))


class Placement(NamedTuple):
    """Where a tree of buffers lives: on one device or on a mesh with `sharding`."""

    make: Callable[[Callable[[], Any]], Any]  # make(init): the tree init() makes, placed
    put: Callable[[Any], Any]
    jit_options: dict  # for a program that returns the tree


def _compile_for(compiled, *trees) -> None:
    """`compiled` (a jitted function) compiled for the shapes of `trees`: a later call with
    arrays of those shapes, placed on the default device, finds the program compiled."""
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), trees)
    compiled.lower(*shapes).compile()


def _zero_rows(spec: replay.ReplaySpec, lanes: int) -> replay.Rows:
    """One chunk of `lanes` lanes' rows, as collectors send them."""
    shapes = replay.row_layout(spec, (lanes, spec.chunk_len))
    return jax.tree.map(lambda shape: np.zeros(shape.shape, shape.dtype), shapes)


def _one_device() -> Placement:
    # The buffers made by one program, the rows put as they are (eagerly, each leaf shape's
    # zeros and each row field's conversion compiled a program of its own).
    return Placement(lambda init: jax.jit(init)(), jax.device_put, {})


def _on_mesh(where: jax.sharding.NamedSharding) -> Placement:
    # Made in place: each device allocates only its own part.
    return Placement(
        lambda init: jax.jit(init, out_shardings=where)(),
        lambda tree: jax.device_put(tree, where),
        {"out_shardings": where},
    )


def _shared(spec: replay.ReplaySpec, place: Placement) -> Layout:
    add = functools.partial(replay.add, spec)
    compiled = jax.jit(add, donate_argnums=0, **place.jit_options)
    return Layout(
        empty=lambda: place.make(functools.partial(replay.init, spec)),
        saved=lambda buffers: buffers,
        put=place.put,
        insert=lambda buffers, rows: compiled(buffers, place.put(rows)),
        add=add,
        first=lambda buffers: buffers,
        sizes=lambda buffers: buffers.size,
        copy=lambda buffers, sources, targets: (buffers, []),  # one buffer: nothing to copy
        clear=lambda buffers, members: buffers,  # every member's rows: none is a member's own
        compile_insert=lambda buffers: (
            None
            if place.jit_options
            else _compile_for(compiled, buffers, _zero_rows(spec, spec.lanes))
        ),
    )


def _by_member(size: int):
    return lambda rows: jax.tree.map(lambda x: x.reshape(size, -1, *x.shape[1:]), rows)


def _copy_stacked(buffers, sources: np.ndarray, targets: list[int]):
    if set(targets) & set(sources.tolist()):
        # A source is overwritten too: copy out of an untouched original.
        return population.gather(buffers, jnp.asarray(sources)), targets
    for target in targets:
        buffers = population.copy_member(buffers, target, int(sources[target]))
    return buffers, targets


def _copy_across_devices(where: jax.sharding.NamedSharding):
    """Stacked buffers split over a mesh: only the copied members cross devices."""
    return lambda buffers, sources, targets: (
        sharding.move_members(buffers, sources, where, True),
        targets,
    )


def _stacked(spec: replay.ReplaySpec, size: int, place: Placement, mesh_sharding) -> Layout:
    add = jax.vmap(functools.partial(replay.add, spec))
    compiled = jax.jit(add, donate_argnums=0, **place.jit_options)
    by_member = _by_member(size)
    copy = _copy_stacked if mesh_sharding is None else _copy_across_devices(mesh_sharding)
    return Layout(
        empty=lambda: place.make(functools.partial(replay.init_population, spec, size)),
        saved=lambda buffers: buffers,
        put=place.put,
        insert=lambda buffers, rows: compiled(buffers, place.put(by_member(rows))),
        add=lambda buffers, rows: add(buffers, by_member(rows)),
        first=lambda buffers: population.member(buffers, 0),
        sizes=lambda buffers: buffers.size,
        copy=copy,
        clear=lambda buffers, members: _emptied(buffers, place.put(jnp.asarray(members))),
        compile_insert=lambda buffers: (
            None
            if place.jit_options
            else _compile_for(compiled, buffers, by_member(_zero_rows(spec, size * spec.lanes)))
        ),
    )


class MembersStacked:
    """The members' arrays of one leaf of listed buffers, seen as that leaf of stacked ones:
    assembled on the host only when a checkpoint writes it (np.asarray), one member at a time.
    Listed and stacked buffers are saved alike, so a checkpoint resumes into either layout (an
    Atari run on a CPU lists its members' buffers on one device and stacks them on several)."""

    def __init__(self, members: tuple[jax.Array, ...]):
        self.members = members
        self.shape = (len(members), *members[0].shape)
        self.dtype = members[0].dtype
        self.nbytes = len(members) * members[0].nbytes

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        stacked = np.empty(self.shape, dtype or self.dtype)
        for index, member in enumerate(self.members):
            stacked[index] = np.asarray(member)
        return stacked


def _listed(spec: replay.ReplaySpec, size: int) -> Layout:
    add = functools.partial(replay.add, spec)
    compiled = jax.jit(add, donate_argnums=0)
    empty_buffer = jax.jit(functools.partial(replay.init, spec))  # one program, every member
    by_member = _by_member(size)

    def insert(buffers, rows):
        lanes = spec.lanes
        for member in range(size):
            part = jax.tree.map(
                lambda x, m=member: jnp.asarray(x[m * lanes : (m + 1) * lanes]), rows
            )
            buffers[member] = compiled(buffers[member], part)
        return buffers

    def add_each(buffers, rows):
        members = by_member(rows)
        return [add(b, population.member(members, m)) for m, b in enumerate(buffers)]

    def copy(buffers, sources, targets):
        originals = list(buffers)
        for target in targets:
            buffers[target] = population.copy_tree(originals[int(sources[target])])
        return buffers, targets

    return Layout(
        empty=lambda: [empty_buffer() for _ in range(size)],
        saved=lambda buffers: jax.tree.map(lambda *members: MembersStacked(members), *buffers),
        put=lambda stacked: [
            jax.tree.map(jnp.asarray, population.member(stacked, m)) for m in range(size)
        ],
        insert=insert,
        add=add_each,
        first=lambda buffers: buffers[0],
        sizes=lambda buffers: jnp.stack([buffer.size for buffer in buffers]),  # not the rows
        copy=copy,
        clear=lambda buffers, members: [
            _emptied(b, bool(cleared)) for b, cleared in zip(buffers, members, strict=True)
        ],
        compile_insert=lambda buffers: _compile_for(
            compiled, buffers[0], _zero_rows(spec, spec.lanes)
        ),
    )


def make_layout(spec: replay.ReplaySpec, layout: str, size: int, mesh=None) -> Layout:
    """The `Layout` named by `layout` (one of `LAYOUTS`), on one device or over `mesh`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown replay layout {layout!r}; choose one of {LAYOUTS}")
    return _made_layout(spec, layout, size, mesh)._replace(name=layout)


def _made_layout(spec: replay.ReplaySpec, layout: str, size: int, mesh) -> Layout:
    if layout == "listed":
        if mesh is not None:
            raise ValueError("listed buffers (sequential execution) live on one device")
        return _listed(spec, size)
    if layout == "shared":
        return _shared(spec, _one_device() if mesh is None else _on_mesh(sharding.replicated(mesh)))
    if mesh is None:
        return _stacked(spec, size, _one_device(), None)
    split = sharding.members(mesh)
    return _stacked(spec, size, _on_mesh(split), split)


def rows_adder(layout: Layout, size: int):
    """add_rows(buffers, rows, joins) -> buffers: `ReplayStore.insert` as a pure function, for
    a program that makes its own rows (device mode). joins: (P,) bool, the members whose
    buffer was just copied (`ReplayStore.take_joins`)."""

    def add_rows(buffers, rows: replay.Rows, joins: jax.Array):
        lane_joins = jnp.repeat(joins, rows.reward.shape[0] // size)
        start = rows.episode_start.at[:, 0].set(rows.episode_start[:, 0] | lane_joins)
        return layout.add(buffers, rows._replace(episode_start=start))

    return add_rows


class ReplayStore:
    """Device replay buffers of one run, in one of `LAYOUTS`."""

    def __init__(self, sampler: replay.Sampler, layout: Layout | str, size: int, mesh=None):
        """`sampler`: the run's one sampler (`run/parts.py`: replay spec, batch size, n-step),
        the one its updates draw with; the buffers are made for its spec. `layout`: made by
        `make_layout` for that spec, `size` and `mesh` (a run's: `LearnerParts.replay_layout`),
        or its name."""
        spec = sampler.spec
        if isinstance(layout, str):
            layout = make_layout(spec, layout, size, mesh)
        self._layout = layout
        self.spec, self.layout, self.size = spec, layout.name, size
        self.sampler = sampler
        self._sample = jax.jit(lambda buffer, key: sampler(buffer, key))
        self.buffers = self._layout.empty()
        self.add_rows = rows_adder(self._layout, size)  # `insert` for a program making rows
        # Members whose next inserted row starts a new stream (their buffer was just copied).
        self.joins = np.zeros(size, bool)
        self._ready = False  # every buffer holds a transition (two rows per lane)

    def sample(self, key: PRNGKey) -> Transition:
        """A batch from the shared buffer, or from member 0's, drawn as the run's updates draw
        theirs (n-step windows too): DvD embeds its states (`obs`), which the window leaves
        as a one-step draw's."""
        return self._sample(self._layout.first(self.buffers), key)

    def insert(self, rows: replay.Rows) -> None:
        """rows: (population * envs_per_member, chunk_len, ...) numpy arrays, member-major."""
        self.buffers = self._layout.insert(self.buffers, self._mark_joins(rows))

    def compile_insert_ahead(self) -> Future:
        """Compile `insert`'s program in a thread (process mode: while the collectors start,
        so that their first rows do not wait for XLA). Its failure is left to the first
        insert, which raises it where the run reports errors."""
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self.buffers)
        return in_background(self._layout.compile_insert, shapes)

    def take_joins(self) -> np.ndarray:
        """The join marks for `add_rows`, cleared here: they apply to the next rows only."""
        joins = self.joins.copy()
        self.joins[:] = False
        return joins

    def _mark_joins(self, rows: replay.Rows) -> replay.Rows:
        """Rows may be host (collectors) or device arrays (device mode): marked where they are."""
        if not self.joins.any():
            return rows
        lanes = np.repeat(self.joins, rows.reward.shape[0] // self.size)
        first = np.zeros(rows.episode_start.shape, bool)
        first[lanes, 0] = True
        self.joins[:] = False
        xp = np if isinstance(rows.episode_start, np.ndarray) else jnp
        return rows._replace(episode_start=xp.logical_or(rows.episode_start, first))

    def ready(self) -> bool:
        """Every buffer holds at least one transition (two rows per lane). Reads the device only
        until it does."""
        if not self._ready:
            self._ready = bool(np.all(sharding.to_host(self._layout.sizes(self.buffers)) >= 2))
        return self._ready

    def copy_members(self, sources: np.ndarray) -> None:
        """Member i's buffer becomes a copy of member sources[i]'s (shared: nothing to copy)."""
        targets = [t for t, s in enumerate(sources.tolist()) if s != t]
        if not targets:
            return
        self.buffers, copied = self._layout.copy(self.buffers, sources, targets)
        self.joins[copied] = True

    def clear_members(self, members: np.ndarray) -> None:
        """members: (P,) bool; their own buffers emptied (a shared buffer keeps every row)."""
        if members.any():
            self.buffers = self._layout.clear(self.buffers, members)
            self.joins[members] = True  # the next rows start new streams

    # --- checkpoints ---

    def save(self):
        """The buffers as a checkpoint holds them, whatever the layout (`Layout.saved`)."""
        return self._layout.saved(self.buffers)

    def counters(self) -> dict:
        return {"joins": np.flatnonzero(self.joins).tolist()}

    def restore(self, buffers, counters: dict | None) -> None:
        """The saved buffers (None: start empty, to refill) and join marks."""
        self.buffers = None  # free the empty buffers first: never two replays' worth of memory
        self.buffers = self._layout.empty() if buffers is None else self._layout.put(buffers)
        self._ready = False
        self.joins[:] = False
        self.joins[(counters or {}).get("joins", [])] = True

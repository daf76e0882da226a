"""The run's replay buffers behind one interface, whatever their layout.

    shared    one buffer whose lanes are every member's environments (CEM-RL, DvD, or
              `replay.shared: true`)
    stacked   one buffer per member, stacked on a leading member axis (the vectorized executor)
    listed    one buffer per member, kept as a list (the sequential executor: slicing a stacked
              buffer per member and call would copy it)

`ReplayStore` inserts collected rows, hands the executors the buffers and the in-jit sampler,
copies members (PBT `replay: copy`), saves and restores. Rows arrive member-major: lanes
m*E .. m*E+E-1 are member m's E environments.

A copied buffer goes on receiving rows from its own member's environments, whose stream does
not continue the source's: the first row written after a copy is marked as an episode start, so
no sampled transition and no frame stack crosses the join (see `replay.sample`).

With a `mesh` (population.devices > 1, population/sharding.py) stacked buffers are split over its
devices by member, and each member's rows are put on the device that holds the member before
they are added; a shared buffer is replicated on every device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.population import replay, sharding
from fastpop.types import PRNGKey, Transition

LAYOUTS = ("shared", "stacked", "listed")


def layout_for(shared: bool, execution: str) -> str:
    if shared:
        return "shared"
    return "listed" if execution == "sequential" else "stacked"


class ReplayStore:
    """Device replay buffers of one run, in one of `LAYOUTS`."""

    def __init__(self, spec: replay.ReplaySpec, layout: str, size: int, batch_size: int, mesh=None):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown replay layout {layout!r}; choose one of {LAYOUTS}")
        if mesh is not None and layout == "listed":
            raise ValueError("listed buffers (sequential execution) live on one device")
        self.spec, self.layout, self.size = spec, layout, size
        self.batch_size = batch_size
        self.sharding = None  # one device
        if mesh is not None:
            split = layout == "stacked"
            self.sharding = sharding.members(mesh) if split else sharding.replicated(mesh)
        placed = {} if self.sharding is None else {"out_shardings": self.sharding}
        add = functools.partial(replay.add, spec)
        add = jax.vmap(add) if layout == "stacked" else add
        self._add = jax.jit(add, donate_argnums=0, **placed)
        self._sample = jax.jit(self.sample_batch)
        self.buffers = self._empty()
        # Members whose next inserted row starts a new stream (their buffer was just copied).
        self.joins = np.zeros(size, bool)
        self._ready = False  # every buffer holds a transition (two rows per lane)

    def _empty(self):
        if self.layout == "shared" and self.sharding is None:
            return replay.init(self.spec)
        if self.layout == "stacked" and self.sharding is None:
            return replay.init_population(self.spec, self.size)
        if self.layout == "listed":
            return [replay.init(self.spec) for _ in range(self.size)]
        # Made in place: each device allocates only its own part.
        make = functools.partial(replay.init_population, self.spec, self.size)
        if self.layout == "shared":
            make = functools.partial(replay.init, self.spec)
        return jax.jit(make, out_shardings=self.sharding)()

    def _to_device(self, tree):
        """Host or device arrays onto the buffers' device(s), split like the buffers."""
        if self.sharding is None:
            return jax.tree.map(jnp.asarray, tree)
        return jax.device_put(tree, self.sharding)

    def sample_batch(self, buffer: replay.ReplayState, key: PRNGKey) -> Transition:
        """One training batch from one buffer, inside jit (what the executors call)."""
        return replay.sample(self.spec, buffer, key, self.batch_size)

    def sample(self, key: PRNGKey) -> Transition:
        """A batch from the shared buffer, or from member 0's (DvD's embedding states)."""
        buffer = self.buffers
        if self.layout == "stacked":
            buffer = population.member(buffer, 0)
        elif self.layout == "listed":
            buffer = buffer[0]
        return self._sample(buffer, key)

    def insert(self, rows: replay.Rows) -> None:
        """rows: (population * envs_per_member, chunk_len, ...) numpy arrays, member-major."""
        rows = self._mark_joins(rows)
        if self.layout == "shared":
            self.buffers = self._add(self.buffers, self._to_device(rows))
        elif self.layout == "stacked":
            lanes = self.spec.lanes
            reshape = lambda x: x.reshape(self.size, lanes, *x.shape[1:])
            self.buffers = self._add(self.buffers, self._to_device(jax.tree.map(reshape, rows)))
        else:
            lanes = self.spec.lanes
            for member in range(self.size):
                part = jax.tree.map(
                    lambda x, m=member: jnp.asarray(x[m * lanes : (m + 1) * lanes]), rows
                )
                self.buffers[member] = self._add(self.buffers[member], part)

    def add_rows(self, buffers, rows: replay.Rows, joins: jax.Array):
        """`insert` as a pure function, for a program that makes its own rows (device mode).
        joins: (P,) bool, the members whose buffer was just copied (`take_joins`)."""
        lane_joins = jnp.repeat(joins, rows.reward.shape[0] // self.size)
        start = rows.episode_start.at[:, 0].set(rows.episode_start[:, 0] | lane_joins)
        rows = rows._replace(episode_start=start)
        add = functools.partial(replay.add, self.spec)
        if self.layout == "shared":
            return add(buffers, rows)
        by_member = jax.tree.map(lambda x: x.reshape(self.size, -1, *x.shape[1:]), rows)
        if self.layout == "stacked":
            return jax.vmap(add)(buffers, by_member)
        return [add(b, population.member(by_member, m)) for m, b in enumerate(buffers)]

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
            buffers = self.buffers if self.layout != "listed" else population.stack(self.buffers)
            self._ready = bool(np.all(sharding.to_host(buffers.size) >= 2))
        return self._ready

    def copy_members(self, sources: np.ndarray) -> None:
        """Member i's buffer becomes a copy of member sources[i]'s (shared: nothing to copy)."""
        if self.layout == "shared":
            return
        targets = [t for t, s in enumerate(sources.tolist()) if s != t]
        if not targets:
            return
        if self.layout == "listed":
            originals = list(self.buffers)
            for target in targets:
                self.buffers[target] = population.copy_tree(originals[int(sources[target])])
        elif self.sharding is not None:  # only the copied members cross devices
            self.buffers = sharding.move_members(self.buffers, sources, self.sharding, True)
        elif set(targets) & set(sources.tolist()):
            # A source is overwritten too: copy out of an untouched original.
            self.buffers = population.gather(self.buffers, jnp.asarray(sources))
        else:
            for target in targets:
                self.buffers = population.copy_member(self.buffers, target, int(sources[target]))
        self.joins[targets] = True

    @property
    def memory_bytes(self) -> int:
        """Device bytes of every buffer (`replay.memory_estimate` plans it before allocating)."""
        buffers = 1 if self.layout == "shared" else self.size
        return buffers * replay.memory_estimate_bytes(self.spec)

    # --- checkpoints ---

    def save(self):
        return self.buffers

    def counters(self) -> dict:
        return {"joins": np.flatnonzero(self.joins).tolist()}

    def restore(self, buffers, counters: dict | None) -> None:
        """The saved buffers (None: start empty, to refill) and join marks."""
        self.buffers = None  # free the empty buffers first: never two replays' worth of memory
        if buffers is None:
            self.buffers = self._empty()
        elif self.layout == "listed":
            self.buffers = [self._to_device(b) for b in buffers]
        else:
            self.buffers = self._to_device(buffers)
        self._ready = False
        self.joins[:] = False
        self.joins[(counters or {}).get("joins", [])] = True

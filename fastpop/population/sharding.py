"""Populations past one device: the member axis sharded over a `jax.sharding.Mesh`.

`population.devices` devices form a one-axis mesh (axis MESH_AXIS, named apart from the vmap
axis `types.POP_AXIS`). Every per-member tree (member states, hparams, per-member replay
buffers, the actors of a shared-critic state) is split over it by member, P / D members per
device; what members share (a shared replay, CEM-RL's and DvD's critic) is replicated.

Independent members (the executor path): `sharded_executor` is `shard_map` of the vectorized
step. Each device vmaps the member loop over its own members, so an update sends nothing between
devices, and reductions over POP_AXIS (TD3's "is any member due an actor step",
`types.population_any`) are taken over the device's members only. The same step as a plain jit
over sharded arrays (XLA's partitioner) computes the same numbers but all-reduces that flag
across devices at every update (an s32 all-reduce inside the update loop of its compiled HLO;
tests/sharding_cases.py checks that the shard_map one has no collective at all).

Shared-critic strategies (`sharded_learning`): their update is written for the population (one
critic, one loss over all members), so it is jitted as it is with the state's shardings; XLA's
partitioner splits the per-member work and all-reduces the critic's gradients; DvD's kernel
gathers every actor's actions.

Between rounds, `move_members` copies only the members that change (PBT exploit, branch-merge,
resets, replay copies): one gather of the changed members' rows and a scatter into their
targets, placed back on the mesh, never the whole population on one device.

Several processes (`--distributed`, distributed/multihost.py) keep this layout: the mesh spans every
process's devices, process by process, so each process holds a contiguous block of members;
rows become arrays with `jax.make_array_from_process_local_data`, and host reads of sharded
arrays go through `to_host` (an all-gather, in lock step) or `local_members` (this process's
own members, no communication).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastpop import population
from fastpop.schema import ConfigError
from fastpop.types import POP_AXIS

MESH_AXIS = "devices"


def device_count(population_section) -> int:
    """The devices the population is split over (the config's `population` section: its
    `devices` and `size`); ConfigError when the machine has too few or the population does not
    split evenly (the config's own checks come first)."""
    setting, size = population_section.devices, population_section.size
    available = jax.devices()
    count = len(available) if setting == "all" else int(setting)
    if count > len(available):
        raise ConfigError(
            f"population.devices: {count} devices asked for, this machine has "
            f"{len(available)} ({available[0].platform}); set population.devices: "
            f"{len(available)} (or all)"
        )
    if size % count:
        raise ConfigError(
            f"population.size: {size} members do not split evenly over the {count} devices of "
            f"population.devices: {setting}; set population.size to a multiple of {count} "
            f"or population.devices to a divisor of {size}"
        )
    return count


def make_mesh(count: int) -> Mesh | None:
    """A mesh over the first `count` devices; None for one device (nothing is sharded)."""
    if count == 1:
        return None
    # Process by process: each process's members are one contiguous block.
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices[:count]), (MESH_AXIS,))


def mesh_for(population_section) -> Mesh | None:
    """The mesh of the config's `population` section (None: one device)."""
    return make_mesh(device_count(population_section))


def members(mesh: Mesh) -> NamedSharding:
    """Leading (member) axis split over the mesh."""
    return NamedSharding(mesh, P(MESH_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def place(tree, sharding):
    """Every leaf of `tree` on the mesh with `sharding` (a sharding or a tree of them)."""
    return jax.device_put(tree, sharding)


def place_from_host(tree, sharding):
    """`place`, compiled: values every process holds whole (a seeded key, a checkpoint's
    arrays) onto a mesh that may span several processes, where `device_put` refuses devices
    this process cannot address."""
    return jax.jit(lambda tree: tree, out_shardings=sharding)(tree)


def to_host(array) -> np.ndarray:
    """The whole of `array` as numpy; an array split over several processes is all-gathered,
    so every process must call this at the same point."""
    if getattr(array, "is_fully_addressable", True) or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def local_members(array) -> np.ndarray:
    """This process's block of the leading axis of an array split over several processes (its
    addressable shards, in order); the whole array otherwise."""
    if getattr(array, "is_fully_addressable", True):
        return np.asarray(array)
    shards = {}
    for shard in array.addressable_shards:
        shards.setdefault(shard.index[0].start or 0, shard.data)
    return np.concatenate([np.asarray(shards[start]) for start in sorted(shards)])


def from_local_members(tree, mesh: Mesh):
    """Each process's block of the leading (member) axis as one array per leaf split over
    `mesh` like the members: the inverse of `local_members`. Every process calls it together."""
    split, count = members(mesh), jax.process_count()

    def leaf(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(split, x, (x.shape[0] * count, *x.shape[1:]))

    return jax.tree.map(leaf, tree)


def sharded_update(member_loop, shared_replay: bool, mesh: Mesh):
    """update(states, replay, hparams, key) -> (states, metrics (P, K)): shard_map over the
    mesh of vmap(member_loop) over each device's members; the states are donated. Member i
    draws split(key, P)[i] as on one device, so the numbers are the single-device ones."""
    replay_axis = None if shared_replay else 0
    batched = jax.vmap(member_loop, in_axes=(0, replay_axis, 0, 0), axis_name=POP_AXIS)
    split, everywhere = P(MESH_AXIS), P()
    local = jax.shard_map(
        batched,
        mesh=mesh,
        in_specs=(split, everywhere if shared_replay else split, split, split),
        out_specs=split,
        check_vma=False,  # the member loop is per device by construction
    )

    def update(states, replay, hparams, key):
        keys = jax.random.split(key, population.population_size(hparams))
        return local(states, replay, hparams, keys)

    return jax.jit(update, donate_argnums=0, out_shardings=members(mesh))


def sharded_executor(plan: population.UpdatePlan, mesh: Mesh) -> population.Executor:
    """The vectorized executor with its members split over `mesh` (see `sharded_update`)."""
    member_loop = population.member_update_loop(plan)
    update = sharded_update(member_loop, plan.shared_replay, mesh)
    return population.Executor(
        "vectorized", update, lambda tree: place(tree, members(mesh)), lambda tree: tree
    )


@functools.cache
def _mover(sharding: NamedSharding, donate: bool):
    def move(tree, targets, sources):
        return jax.tree.map(lambda leaf: leaf.at[targets].set(leaf[sources]), tree)

    return jax.jit(move, out_shardings=sharding, donate_argnums=(0,) if donate else ())


def move_members(tree, sources, sharding: NamedSharding, donate: bool = False):
    """Member i of the result is member sources[i] of the stacked `tree`, copying only the
    members with sources[i] != i (read from the tree before any is overwritten). Their count
    is padded to a power of two by repeating a copy, so few programs are ever compiled."""
    sources = np.asarray(sources)
    targets = np.flatnonzero(sources != np.arange(len(sources)))
    if not targets.size:
        return tree
    targets = np.resize(targets, 1 << (targets.size - 1).bit_length())
    move = _mover(sharding, donate)
    return move(tree, jnp.asarray(targets, jnp.int32), jnp.asarray(sources[targets], jnp.int32))


def member_mover(mesh: Mesh):
    """move(states, sources) -> states for an executor's stacked states on `mesh`."""
    return lambda states, sources: move_members(states, sources, members(mesh))


def sharded_learning(training, mesh: Mesh):
    """A shared-parameter `Training` (CEM-RL, DvD) with its per-member part (what
    `training.members` returns) split over `mesh` and the rest (the critic) replicated; its
    update jitted with those shardings, and its states placed back after each round."""
    split, everywhere = members(mesh), replicated(mesh)
    layout = {}  # the state's tree structure and shardings, known from the first init

    def shardings_of(states):
        per_member = {id(leaf) for leaf in jax.tree.leaves(training.members(states))}
        return jax.tree.map(lambda leaf: split if id(leaf) in per_member else everywhere, states)

    def adopt(tree):
        tree = training.adopt(tree)
        if jax.tree.structure(tree) == layout.get("structure"):
            return place(tree, layout["shardings"])
        return place(tree, split)  # a stacked per-member tree: hparams

    def init(key, hparams):
        states, strategy_state = training.init(key, hparams)
        layout["structure"] = jax.tree.structure(states)
        layout["shardings"] = shardings_of(states)
        layout.pop("update", None)
        return place(states, layout["shardings"]), strategy_state

    def update(states, replay, hparams, key):
        if "update" not in layout:
            layout["update"] = jax.jit(
                training.update, out_shardings=(layout["shardings"], everywhere), donate_argnums=0
            )
        return layout["update"](states, replay, hparams, key)

    def between_rounds(round_):
        result = training.between_rounds(round_)
        return result._replace(states=place(result.states, layout["shardings"]))

    return training._replace(init=init, update=update, adopt=adopt, between_rounds=between_rounds)

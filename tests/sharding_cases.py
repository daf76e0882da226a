"""Learners with population.devices > 1 against the same learners on one device (run by
tests/test_sharding.py in ONE subprocess: the forced host device count must be set before JAX
starts, and JAX's start-up and compiles are the cost).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m tests.sharding_cases [case ...]

Each case drives a sharded learner and a one-device learner with the same rows and evaluation
rounds (`tests.test_resume`), then checks that their member states, hparams, strategy states and
replay buffers agree to float tolerance, that they made the same strategy decisions, and where
the arrays live. Prints one JSON object: case -> "ok" or what failed.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import config as config_lib
from fastpop.compilation import compile_stats
from fastpop.population import sharding
from fastpop.run.parts import build_run
from fastpop.run.startup import make_collection
from fastpop.schema import ConfigError
from fastpop.strategies.base import Evaluation
from tests.helpers import program_names
from tests.test_resume import SMALL, host, learner_for, rows_for

PRIOR = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}"
# TD3 sizes are 6 and 3 only, and CEM-RL's and DvD's programs are the same: JAX's persistent
# cache (tests/conftest.py) then compiles each once; it is most of this file's time.
CASES = {  # name -> (overrides, population.devices); 4 host devices
    # agent.observation_norm: each member's statistics, updated on its device, copied by PBT
    "td3-pbt-replay-copy": (
        [
            "strategy=pbt",
            "pbt.interval=1",
            "pbt.replay=copy",
            "population.size=6",
            PRIOR,
            "agent.observation_norm=true",
        ],
        "3",
    ),
    # the recipe's critic: C51 with LayerNorm, on n-step windows
    "sac": (
        [
            "algo=sac",
            "population.size=4",
            "agent.n_step=3",
            "agent.critic=distributional",
            "agent.num_atoms=11",
            "agent.layer_norm=true",
        ],
        "2",
    ),
    "dqn-shared-replay": (
        [
            "algo=dqn",
            "env.id=CartPole-v1",
            "population.size=4",
            "replay.shared=true",
            "agent.dueling=true",
        ],
        "all",
    ),
    "td3-cemrl": (["strategy=cemrl", "population.size=3", "replay.shared=true"], "3"),
    "td3-dvd": (
        [
            "strategy=dvd",
            "population.size=3",
            "replay.shared=true",
            "dvd.embedding_states=4",
            "dvd.coefficients=[0.5]",  # lambda > 0: the kernel over every actor's actions
            "dvd.adapt=fixed",
        ],
        "3",
    ),
}
CHUNKS = 4
TRACED = program_names(compile_stats.TRACE)  # the functions JAX traced for a program


def drive(learner) -> list:
    """tests.test_resume.drive, keeping what the strategy decided each round."""
    decisions, size = [], learner.config.population.size
    for chunk in range(CHUNKS):
        learner.insert(rows_for(learner, chunk))
        while learner.limiter.can_sample():
            learner.update()
        if chunk % 2:
            returns = np.random.default_rng(100 + chunk).normal(size=size)
            evaluation = Evaluation(chunk // 2, learner.limiter.inserted, returns)
            events, scalars = learner.strategy_step(evaluation)
            decisions.append(([(e["target"], e["source"]) for e in events], sorted(scalars)))
    return decisions


def split_over(array, count: int) -> bool:
    spec = array.sharding.spec
    return len(array.sharding.device_set) == count and len(spec) > 0 and spec[0] == "devices"


def check_placement(learner, count: int) -> None:
    """Per-member trees split over the devices; the shared replay and critic on every one."""
    buffers = jax.tree.leaves(learner.replay.buffers)
    if learner.config.replay.shared:
        assert all(leaf.sharding.is_fully_replicated for leaf in buffers)
    else:
        assert all(split_over(leaf, count) for leaf in buffers), "buffers not split"
    states = learner.states
    if learner.config.strategy in ("cemrl", "dvd"):
        assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree.leaves(states.critic))
        states = learner.training.members(states)
    assert all(split_over(leaf, count) for leaf in jax.tree.leaves(states)), "members not split"
    assert all(split_over(leaf, count) for leaf in jax.tree.leaves(learner.member_hparams))


def check_local_update(learner) -> None:
    """TD3's 'is any member due an actor step' stays on each device: the compiled update sends
    nothing between devices (as a plain jit over sharded arrays it would all-reduce it)."""
    args = (learner.states, learner.replay.buffers, learner.member_hparams, learner.key)
    text = learner.training.update.lower(*args).compile().as_text()
    collectives = [op for op in ("all-reduce", "all-gather", "collective-permute") if op in text]
    assert not collectives, f"the sharded update communicates: {collectives}"


def check_rows_on_member_devices(learner, reference, count: int) -> None:
    """Each device's part of the stacked replay holds exactly its own members' rows."""
    per_device = learner.config.population.size // count
    want = np.asarray(reference.replay.buffers.rows.obs)
    for shard in learner.replay.buffers.rows.obs.addressable_shards:
        first = shard.index[0].start or 0
        assert shard.data.shape[0] == per_device
        np.testing.assert_array_equal(np.asarray(shard.data), want[first : first + per_device])


def run_case(name: str) -> None:
    overrides, devices = CASES[name]
    sharded = learner_for(*overrides, f"population.devices={devices}")
    reference = learner_for(*overrides)
    count = len(sharded.mesh.devices.flat)
    assert reference.mesh is None and count == (4 if devices == "all" else int(devices))
    decisions = drive(sharded)
    assert decisions == drive(reference), "the strategies decided differently"
    assert sharded.updates == reference.updates > 0
    check_placement(sharded, count)
    if name == "td3-pbt-replay-copy":
        assert any(moves for moves, _ in decisions), "PBT moved no member"
        check_rows_on_member_devices(sharded, reference, count)
        check_local_update(sharded)
        # members moved with their observation statistics, every member's counted
        assert np.all(np.asarray(sharded.states.observation_norm.count) > 0)
    expected, actual = host(reference.saved_tree(True)), host(sharded.saved_tree(True))
    assert jax.tree.structure(expected) == jax.tree.structure(actual)
    assert sharded.saved_counters() == reference.saved_counters()
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree.leaves(actual), strict=True
    ):
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path)
        )


DEVICE_MODE = [  # TD3 on gymnax's Pendulum (quick to compile), stepped on the device
    "env.id=gymnax/Pendulum-v1",
    "env.episode_length=20",
    "collect.envs_per_member=2",
    "collect.chunk_len=8",
    "collect.warmup_steps=8",
    "replay.min_size=16",
    "replay.samples_per_insert=4",
    "agent.n_step=3",  # windows that cross the 20-step episodes' truncations
    "population.size=4",
    "replay.shared=true",  # stays on every device through the chunk calls (check_placement)
    PRIOR,  # members differ (PBT's moves between devices: td3-pbt-replay-copy)
]


def check_device_mode() -> None:
    """Device mode over 2 devices: each device steps its own members' env lanes; the states,
    buffers and env lanes equal one device's after the same chunks (each made and inserted in
    one call, learned from in a second, each program compiled once)."""
    sharded = learner_for(*DEVICE_MODE, "population.devices=2")
    reference = learner_for(*DEVICE_MODE)
    collections = [
        make_collection(build_run(learner.config), learner) for learner in (sharded, reference)
    ]
    TRACED.clear()
    for _ in range(CHUNKS):
        for learner, collection in zip((sharded, reference), collections, strict=True):
            collection.feed(learner)
    assert sharded.updates == reference.updates > 0
    # Each chunk program traced once per learner: no argument is placed otherwise at the first
    # call than the program returns it (the learner's key was, and compiled it twice).
    assert TRACED.count("collect_chunk") == TRACED.count("chunk_updates") == 2, TRACED
    check_placement(sharded, 2)
    lanes = jax.tree.leaves(collections[0].lanes)
    assert all(split_over(leaf, 2) for leaf in lanes if leaf.ndim), "env lanes not split"
    expected = host((reference.saved_tree(True), collections[1].saved()))
    actual = host((sharded.saved_tree(True), collections[0].saved()))
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree.leaves(actual), strict=True
    ):
        np.testing.assert_allclose(
            got, want, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path)
        )


def check_moves_only_changed_members() -> None:
    """A strategy's copy sends only the changed members' rows between devices (an all-reduce of
    those rows), never the population; overlapping sources read the state before the copy."""
    mesh = sharding.make_mesh(4)
    values = jnp.arange(16 * 1000, dtype=jnp.float32).reshape(16, 1000)
    keys = jax.random.split(jax.random.key(0), 16)
    tree = sharding.place({"w": values, "key": keys}, sharding.members(mesh))
    sources = np.arange(16)
    sources[[1, 5, 8]] = [8, 0, 3]  # member 8 is copied from and overwritten
    moved = sharding.move_members(tree, sources, sharding.members(mesh))
    np.testing.assert_array_equal(np.asarray(moved["w"]), np.asarray(values)[sources])
    key_data = jax.random.key_data
    np.testing.assert_array_equal(key_data(moved["key"]), np.asarray(key_data(keys))[sources])
    assert split_over(moved["w"], 4) and split_over(moved["key"], 4)
    padded = jnp.asarray([1, 5, 8, 1])  # three copies, padded to four
    move = sharding._mover(sharding.members(mesh), False)
    text = move.lower(tree, padded, padded).compile().as_text()
    shapes = re.findall(r"= \w+\[([\d,]*)\][^ ]* (?:all-reduce|all-gather|all-to-all)\(", text)
    assert shapes and all(shape.split(",")[0] == "4" for shape in shapes if shape), shapes


def check_all_must_divide() -> None:
    """population.devices: all on 4 devices with 6 members is refused when the learner is
    prepared, naming the fix."""
    config = config_lib.load_config(None, [*SMALL, "population.size=6", "population.devices=all"])
    try:
        build_run(config)
    except ConfigError as error:
        assert "population.size: 6 members do not split evenly over the 4 devices" in str(error)
        assert "population.devices to a divisor of 6" in str(error)
    else:
        raise AssertionError("population.devices: all with 6 members on 4 devices ran")


CHECKS = {
    **{name: functools.partial(run_case, name) for name in CASES},
    "device-mode": check_device_mode,
    "moves-only-changed-members": check_moves_only_changed_members,
    "all-must-divide": check_all_must_divide,
}


def main(names: list[str]) -> None:
    assert jax.device_count() == 4, "run with XLA_FLAGS=--xla_force_host_platform_device_count=4"
    results = {}
    for name in names or CHECKS:
        start = time.perf_counter()
        try:
            CHECKS[name]()
            results[name] = "ok"
        except Exception:  # reported per case, the others still run
            results[name] = traceback.format_exc(limit=4)
        print(f"{name}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])

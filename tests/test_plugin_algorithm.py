"""The acceptance check of an algorithm added as a plugin: DDPG, written in one file
(tests/ddpg_plugin.py) with fastpop's building blocks and named only by a config's `plugins:` and
`algo:`, with no edit anywhere else, trains with collector processes (which import the plugin
from the config they re-read), in device mode, where it learns gymnax's Pendulum, and under PBT,
whose exploits copy a DDPG member's whole state and perturb its hparams.

Every run has the same shapes (2 members, 64-64 networks, batches of 64): the device runs share
their compiled programs."""

from __future__ import annotations

import importlib
import sys

import jax
import numpy as np
import pytest

from fastpop.agents import registry
from fastpop.bench import floors
from fastpop.collect.acting import numpy_policy_for
from fastpop.config import load_config
from fastpop.config.build import build_env_spec
from fastpop.types import EnvSpec
from tests.dependencies import require
from tests.helpers import metric_rows, train_here
from tests.runs import REPO, TD3_PENDULUM, TOLERANCE, read_jsonl

PLUGIN, NAME = "tests.ddpg_plugin", "ddpg"
DEVICE_PRESET = REPO / "configs" / "td3_gymnax_pendulum_cpu.yaml"  # gymnax/Pendulum-v1
WARMUP, CALL = 512, 16  # random env steps before learning; updates per call
# How far the rate limiter lets the updates per member trail one per env step after the warm-up
# (learn/rate_limiter.py: tolerance x min_size transitions' worth, plus a call)
UPDATES_SLACK = TOLERANCE * WARMUP + CALL
DDPG = [
    f"plugins=[{PLUGIN}]",
    f"algo={NAME}",
    "population.size=2",
    "agent.hidden_sizes=[64,64]",
    "agent.batch_size=64",
    "replay.samples_per_insert=64",  # = batch_size: one update per env step
    "replay.capacity=8192",
    f"replay.min_size={WARMUP}",
    f"collect.warmup_steps={WARMUP}",
    "collect.chunk_len=16",
    f"train.updates_per_call={CALL}",
    "eval.episodes=2",
]
DDPG_HPARAMS = {"actor_lr", "critic_lr", "discount", "tau", "exploration_noise", "n_step"}
RANDOM_RETURN = -1200.0  # about a random policy's on Pendulum's 200 steps
LEARNED = -400.0  # what tests/test_learning.py asks of TD3 and SAC


def forget_plugin() -> None:
    """As in a fresh process: the plugin neither imported nor registered."""
    sys.modules.pop(PLUGIN, None)
    if NAME in registry.NAMES:
        registry.unregister(NAME)


@pytest.fixture(autouse=True)
def plugin():
    """Each run imports the plugin through its config; taken out afterwards, as other tests
    list the registered names."""
    forget_plugin()
    yield
    forget_plugin()


def member(tree, index: int):
    return jax.tree.map(lambda leaf: np.asarray(leaf[index]), tree)


def assert_trees_differ(a, b) -> None:
    assert any(
        not np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def assert_trained_ddpg(trained, steps: int) -> list[dict]:
    """Both members stepped `steps`, updated once per env step after the warm-up, with DDPG's
    state (one critic, lagging Polyak targets) and hparams; its metrics rows."""
    assert load_config(trained.run_dir / "config.yaml").plugins == (PLUGIN,)
    states, updates = trained.learner.states, trained.learner.updates
    assert type(states).__name__ == "DDPGState"
    assert abs(updates - (steps - WARMUP)) <= UPDATES_SLACK
    np.testing.assert_array_equal(states.step, [updates, updates])
    for index in range(2):
        state = member(states, index)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(state))
        assert_trees_differ(state.actor, state.target_actor)  # trained, the targets behind
        assert_trees_differ(state.critic, state.target_critic)
        # One critic: its output layer has one unit, not TD3's twins' two
        assert state.critic["params"]["MLP_0"]["Dense_2"]["kernel"].shape == (64, 1)
    rows = metric_rows(trained.run_dir)
    assert {row["member"] for row in rows} == {0, 1}
    assert max(row["member_env_steps"] for row in rows) >= steps
    assert all(set(row["hparams"]) == DDPG_HPARAMS for row in rows)
    return rows


def test_the_plugins_update_floor_is_read_from_its_entry():
    """`fastpop bench update`'s state-traffic floor of an algorithm it does not know by name:
    from what the plugin's entry says its update steps and writes, every step."""
    plugin = importlib.import_module(PLUGIN)
    agent = plugin.make_ddpg(EnvSpec((3,), action_dim=1), plugin.DDPGConfig(hidden_sizes=(8, 8)))
    hparams = agent.default_hparams()
    state = jax.eval_shape(agent.init, jax.random.key(0), hparams)
    size = {name: floors.tree_bytes(getattr(state, name)) for name in state._fields}
    expected = sum(4 * size[tree] + 2 * size[f"{tree}_opt"] for tree in ("actor", "critic"))
    expected += 2 * (size["target_actor"] + size["target_critic"])  # read and written
    assert floors.state_bytes_per_update(agent, hparams) == expected
    assert floors.update_anatomy(agent, hparams).branch_fraction is None  # no conditional


def test_ddpg_plugin_trains_with_collector_processes(tmp_path):
    """gymnasium's Pendulum-v1 stepped by a collector process, which acts through the numpy
    policy the plugin's registry entry names, evaluated by the evaluator process."""
    trained = train_here(
        tmp_path,
        TD3_PENDULUM,
        *DDPG,
        "collect.num_collectors=1",
        "train.total_env_steps=1024",
        "eval.interval=1024",
    )
    rows = assert_trained_ddpg(trained, 1024)
    assert all(np.isfinite(row["return_mean"]) for row in rows)
    # What the workers decided for its collector (collect/workers.py): numpy, no JAX
    spec, published = build_env_spec(trained.config), trained.learner.host_policy_tree()
    assert numpy_policy_for(NAME, spec, published, 2, 1).kind == "deterministic"


# The two device runs in one xdist worker, one after the other: the second reuses the first's
# compiled programs rather than compiling them beside it.
SHARED_PROGRAMS = pytest.mark.xdist_group("ddpg_plugin_device")


@pytest.mark.optimized  # trains to a threshold
@SHARED_PROGRAMS
def test_ddpg_plugin_learns_pendulum_in_device_mode(tmp_path):
    """gymnax's Pendulum stepped on the device: within 6k env steps per member the better
    member swings up and the other is well past a random policy. (Seeds 0-4 of these sizes at
    6k: best -57 to -183, worse -124 to -688, on two members' two evaluation episodes.)"""
    require("gymnax")
    steps = 6144
    trained = train_here(
        tmp_path, DEVICE_PRESET, *DDPG, f"train.total_env_steps={steps}", "eval.interval=2048"
    )
    rows = assert_trained_ddpg(trained, steps)
    final = [row["return_mean"] for row in rows if row["member_env_steps"] == steps]
    assert len(final) == 2 and max(final) > LEARNED and min(final) > RANDOM_RETURN * 2 / 3, rows


@SHARED_PROGRAMS
def test_ddpg_plugin_trains_under_pbt_whose_exploits_copy_its_state(tmp_path):
    """PBT on the device, two members: at each of its two rounds the worse copies the better's
    whole state (networks, targets, Adam moments) and a perturbed actor_lr. The last round
    comes at the run's end, so no update follows it: the two members' states are equal."""
    require("gymnax")
    trained = train_here(
        tmp_path,
        DEVICE_PRESET,
        *DDPG,
        "train.total_env_steps=1024",
        "eval.interval=512",
        "strategy=pbt",
        "pbt.interval=512",
        "pbt.bottom_fraction=0.5",
        "pbt.top_fraction=0.5",
        "pbt.wait=true",
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
    )
    rows = assert_trained_ddpg(trained, 1024)
    exploits = read_jsonl(trained.run_dir / "lineage.jsonl")
    assert [(e["kind"], e["round"]) for e in exploits] == [("exploit", 0), ("exploit", 1)]
    last = exploits[-1]
    assert last["member_env_steps"] == 1024 and last["source_fitness"] >= last["target_fitness"]
    target, source = last["target"], last["source"]
    (ranked,) = [r for r in rows if r["eval_index"] == last["eval_index"] and r["member"] == source]
    explored = {k for k, v in last["new_hparams"].items() if v != ranked["hparams"][k]}
    assert explored == {"actor_lr"}  # the source's hparams, the one with a prior perturbed
    states, hparams = trained.learner.states, trained.learner.hparams
    for copied, original in zip(
        jax.tree.leaves(member(states, target)),
        jax.tree.leaves(member(states, source)),
        strict=True,
    ):
        np.testing.assert_array_equal(copied, original)
    assert float(hparams.actor_lr[target]) == pytest.approx(last["new_hparams"]["actor_lr"])

"""Strategies: grid and prior sweeps, PBT and branch-and-merge decisions, and the learner applying
them on device (whole-state gathers, replay keep/copy, hparams without recompiling)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.analysis.lineage import Jump, Segment, ancestry, copy_jumps
from fastpop.learn.learner import Learner
from fastpop.population import replay
from fastpop.run.parts import build_learner
from fastpop.strategies import pbt
from fastpop.strategies.base import Evaluation, Selection
from fastpop.strategies.branch_merge import make_branch_merge
from fastpop.strategies.priors import parse_priors

TD3_PRIORS = (
    "population.priors={actor_lr: {log_uniform: [3.0e-5, 3.0e-3]}, "
    "discount: {uniform: [0.9, 1.0]}, policy_delay: {int_uniform: [1, 5]}}"
)
SMALL = [
    "agent.hidden_sizes=[8,8]",
    "agent.batch_size=4",
    "replay.capacity=256",
    "replay.min_size=4",
]


def load(*overrides: str) -> config_lib.Config:
    return config_lib.load_config(None, [*SMALL, *overrides])


# --- independent: grids and priors ---


def test_grid_gives_every_combination_in_a_stable_order():
    config = load("population.grid={actor_lr: [1.0e-4, 3.0e-4, 1.0e-3], discount: [0.98, 0.99]}")
    assert config.population.size == 6
    overrides = config_lib.member_overrides(config)
    assert overrides == [
        {"actor_lr": a, "discount": d} for a in (1e-4, 3e-4, 1e-3) for d in (0.98, 0.99)
    ]
    # The saved config reloads to the same members.
    assert config_lib.config_from_dict(config_lib.config_to_dict(config)) == config


def test_grid_with_repeats_and_priors_together():
    config = load(
        "population.grid={discount: [0.98, 0.99]}",
        "population.size=4",
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
    )
    overrides = config_lib.member_overrides(config)
    assert [o["discount"] for o in overrides] == [0.98, 0.98, 0.99, 0.99]
    rates = [o["actor_lr"] for o in overrides]
    assert len(set(rates)) == 4 and all(1e-4 <= r <= 1e-3 for r in rates)
    assert config_lib.member_overrides(config) == overrides  # seeded: the same every time


def test_learner_starts_members_with_their_hparams():
    config = load("population.grid={actor_lr: [1.0e-4, 1.0e-3], policy_delay: [1, 3]}")
    learner = build_learner(config)
    assert learner.hparams.actor_lr.dtype == np.float32
    assert learner.hparams.policy_delay.dtype == np.int32
    assert [(h["actor_lr"], h["policy_delay"]) for h in learner.all_member_hparams()] == [
        (pytest.approx(1e-4), 1),
        (pytest.approx(1e-4), 3),
        (pytest.approx(1e-3), 1),
        (pytest.approx(1e-3), 3),
    ]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["strategy=pbt", "population.size=1", TD3_PRIORS], "strategy pbt needs at least 2"),
        (
            ["strategy=pbt", "population.size=3", TD3_PRIORS],
            r"pbt: .* of 3 members select 0 to replace and 0 to copy from",
        ),
        (["strategy=pbt"], "population.priors: strategy pbt draws the hparams"),
        (["population.grid={actor_lr: []}"], "population.grid.actor_lr: expected a non-empty"),
        (["population.grid={discount: [0.9, 1.5]}"], r"must be in \[0, 1\], got 1.5"),
        (["population.priors={actor_lr: {normal: [0, 1]}}"], "unknown kind 'normal'"),
        (["population.priors={policy_delay: {uniform: [1, 5]}}"], "integer hparam"),
        (["population.priors={actor_lr: {log_uniform: [1e-4, 1e-3]}}", "algo=sac",
          "population.grid={actor_lr: [1.0e-4]}"], "is also in population.grid"),
        (["population.grid={actor_rate: [1]}"], "did you mean 'population.grid.actor_lr'"),
        (["population.size=5", "population.grid={discount: [0.9, 0.99]}"], "multiple of the grid"),
        (["strategy=branch_merge", "branch_merge.step_size_multipliers=[1.0]"], "one multiplier"),
        (["strategy=pbt", "pbt.replay=share", TD3_PRIORS], "must be one of keep, copy"),
    ],
)  # fmt: skip
def test_bad_strategy_configs_are_refused(overrides, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        load(*overrides)


# --- PBT decisions ---


def pbt_strategy(size=4, **kwargs):
    priors = parse_priors(load(TD3_PRIORS).population.priors)
    settings = pbt.PBTSettings(interval=100, evaluation_interval=50, **kwargs)
    return pbt.make_pbt(size, priors, seed=0, settings=settings)


@pytest.mark.parametrize("name", ["pbt", "pb2"])
def test_pbt_wait_makes_the_learner_pause_for_each_evaluation(name):
    assert not config_lib.build_strategy(load(f"strategy={name}", TD3_PRIORS)).waits_for_evaluation
    waiting = config_lib.build_strategy(load(f"strategy={name}", TD3_PRIORS, "pbt.wait=true"))
    assert waiting.waits_for_evaluation


def member_hparams(size=4):
    return [
        {"actor_lr": 1e-3 * (m + 1), "discount": 0.95, "policy_delay": m + 1, "tau": 0.005}
        for m in range(size)
    ]


def test_pbt_waits_for_its_interval_then_replaces_the_bottom():
    strategy = pbt_strategy()
    state = strategy.init()
    state, selection = strategy.step(state, Evaluation(0, 50, np.array([1.0, 2, 3, 4])), [])
    assert selection is None
    hparams = member_hparams()
    state, selection = strategy.step(state, Evaluation(1, 100, np.array([4.0, 3, 2, 1])), hparams)
    np.testing.assert_array_equal(selection.sources, [0, 1, 2, 0])
    (event,) = selection.events
    assert (event["target"], event["source"], event["round"]) == (3, 0, 0)
    assert (event["target_fitness"], event["source_fitness"]) == (1.0, 4.0)
    assert event["old_hparams"] == hparams[3]
    new = selection.hparams[3]
    assert new["tau"] == 0.005  # no prior: copied from the source, not explored
    assert 3e-5 <= new["actor_lr"] <= 3e-3 and 0.9 <= new["discount"] <= 1.0
    assert isinstance(new["policy_delay"], int) and 1 <= new["policy_delay"] <= 5
    assert selection.hparams[:3] == hparams[:3]
    # The copy inherits the source's history: its fitness is the source's until re-evaluated.
    assert state.history[3] == state.history[0] and state.next_round == 200
    _, selection = strategy.step(state, Evaluation(2, 150, np.array([4.0, 3, 2, 1])), hparams)
    assert selection is None


def test_pbt_fitness_averages_the_window_and_nan_ranks_last():
    strategy = pbt_strategy(fitness_window=2)
    state = strategy.init()
    state, _ = strategy.step(state, Evaluation(0, 50, np.array([10.0, 0, 0, 0])), [])
    # Latest returns alone would rank member 0 last; with the window its mean is 5.5.
    state, selection = strategy.step(
        state, Evaluation(1, 100, np.array([1.0, 2, 3, np.nan])), member_hparams()
    )
    np.testing.assert_array_equal(pbt.fitness(state.history)[:3], [5.5, 1.0, 1.5])
    (event,) = selection.events
    assert event["target"] == 3 and event["source"] == 0


def test_pbt_replaces_every_non_finite_member_and_is_deterministic():
    strategy = pbt_strategy(size=6, bottom_fraction=0.2, top_fraction=0.4)
    returns = np.array([np.nan, 5.0, np.nan, 1.0, np.nan, 3.0])
    decisions = [
        strategy.step(strategy.init(), Evaluation(0, 100, returns), member_hparams(6))[1]
        for _ in range(2)
    ]
    assert sorted(e["target"] for e in decisions[0].events) == [0, 2, 4]
    assert {e["source"] for e in decisions[0].events} <= {1, 5}
    np.testing.assert_array_equal(decisions[0].sources, decisions[1].sources)
    assert decisions[0].hparams == decisions[1].hparams


# --- applying decisions on device ---


def filled_learner(*overrides: str) -> Learner:
    """A learner whose members and buffers all differ (different data, a few updates)."""
    config = load("collect.chunk_len=8", "train.updates_per_call=2", *overrides)
    learner = build_learner(config)
    rng = np.random.default_rng(0)
    size = config.population.size
    layout = replay.row_layout(learner.replay.spec, (size, config.collect.chunk_len))
    for _ in range(3):
        rows = replay.Rows(
            *(rng.normal(size=leaf.shape).astype(leaf.dtype) for leaf in layout[:3]),
            *(np.zeros(leaf.shape, bool) for leaf in layout[3:]),
        )
        learner.insert(rows)
    learner.update()
    return learner


def snapshot(tree):
    return jax.tree.map(np.array, tree)


def member_of(tree, index: int):
    if isinstance(tree, list):
        return snapshot(tree[index])
    return snapshot(population.member(tree, index))


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    "execution,replay", [("vectorized", "copy"), ("sequential", "keep"), ("sequential", "copy")]
)
def test_exploit_copies_the_whole_member_and_leaves_the_rest_bit_identical(execution, replay):
    learner = filled_learner(f"population.execution={execution}")
    before_states = [member_of(learner.states, m) for m in range(4)]
    before_buffers = [member_of(learner.buffers, m) for m in range(4)]
    hparams = learner.all_member_hparams()
    new_hparams = [dict(h) for h in hparams]
    new_hparams[1] = {**hparams[3], "actor_lr": 1e-4, "policy_delay": 4}
    sources = np.array([0, 3, 2, 3])
    compiled = learner.training.update._cache_size() if execution == "vectorized" else None
    learner.apply_selection(Selection(sources, new_hparams, [], copy_replay=replay == "copy"))

    state = learner.states if execution == "vectorized" else population.stack(learner.states)
    copied = population.member(state, 1)
    # Each part of the member state comes from the source: actor, critic, targets, optimizer.
    for part in ("actor", "critic", "target_actor", "target_critic", "actor_opt", "critic_opt"):
        assert_same(getattr(copied, part), getattr(before_states[3], part))
    assert_same(copied, before_states[3])
    for member in (0, 2, 3):
        assert_same(member_of(learner.states, member), before_states[member])
    expected_buffer = before_buffers[3] if replay == "copy" else before_buffers[1]
    assert_same(member_of(learner.buffers, 1), expected_buffer)
    for member in (0, 2, 3):
        assert_same(member_of(learner.buffers, member), before_buffers[member])
    assert learner.all_member_hparams()[1]["policy_delay"] == 4
    assert learner.all_member_hparams()[1]["actor_lr"] == pytest.approx(1e-4)
    learner.update()  # new hparams, same program
    if compiled is not None:
        assert learner.training.update._cache_size() == compiled


def test_non_finite_members_are_found():
    learner = filled_learner()
    assert learner.finite_members().tolist() == [True] * 4
    actor = jax.tree.map(lambda x: x.at[2].set(np.nan), learner.states.actor)
    learner.states = learner.states._replace(actor=actor)
    assert learner.finite_members().tolist() == [True, True, False, True]


# 4 members: a leaf per check, groups of up to 5 values per member, all in one
@pytest.mark.parametrize("group_values", [4, 20, 1 << 24])
def test_finite_members_reads_every_value_of_every_float_leaf(group_values):
    rng = np.random.default_rng(0)
    members = {
        "kernel": rng.normal(size=(4, 2, 3)).astype(np.float32),
        "bias": rng.normal(size=(4, 3)).astype(np.float32),
        "half": rng.normal(size=(4, 2)).astype(jax.numpy.bfloat16),
        "scale": rng.normal(size=(4,)).astype(np.float32),
        "count": np.zeros((4, 2), np.int32),  # not floating point: never read
    }
    members["kernel"][1, 1, 2] = np.inf  # the last value of one leaf
    members["half"][2, 0] = np.nan  # another dtype's group
    members["scale"][3] = -np.inf  # a leaf of one value per member
    finite = population.finite_members(members, group_values=group_values)
    assert finite.tolist() == [True, False, False, False]


@pytest.mark.parametrize("execution", ["vectorized", "sequential"])
def test_a_non_finite_member_is_reset_from_the_best_and_the_others_are_untouched(execution):
    learner = filled_learner(f"population.execution={execution}")
    stacked = learner.training.release(learner.states)
    poisoned = stacked._replace(critic=jax.tree.map(lambda x: x.at[2].set(np.nan), stacked.critic))
    learner.states = learner.training.adopt(poisoned)
    before = [member_of(learner.states, m) for m in range(4)]
    hparams = learner.all_member_hparams()

    # independent: no strategy decision, so the learner's reset is all that acts
    events, _ = learner.strategy_step(Evaluation(0, 100, np.array([1.0, 9.0, 50.0, 3.0])))
    assert [(e["kind"], e["target"], e["source"]) for e in events] == [("reset", 2, 1)]
    assert np.isnan(events[0]["target_fitness"]) and events[0]["source_fitness"] == 9.0
    assert learner.finite_members().all()
    assert_same(member_of(learner.states, 2), before[1])  # the best finite member's state
    for member in (0, 1, 3):  # bit for bit
        assert_same(member_of(learner.states, member), before[member])
    assert learner.all_member_hparams() == hparams  # it keeps its own configuration
    assert learner.strategy_step(Evaluation(1, 200, np.array([1.0, 2, 3, 4])))[0] == []


def test_branch_merge_restarts_every_member_from_the_promoted_one():
    learner = filled_learner("strategy=branch_merge")
    rates = [h["actor_lr"] for h in learner.all_member_hparams()]
    assert rates == pytest.approx([3e-5, 3e-4, 3e-4, 3e-4])  # the first member at 0.1x
    promoted = member_of(learner.states, 2)
    strategy = make_branch_merge(4, round_steps=100)
    _, selection = strategy.step(
        strategy.init(),
        Evaluation(0, 100, np.array([1.0, np.nan, 7.0, 3.0])),
        learner.all_member_hparams(),
    )
    assert sorted(e["target"] for e in selection.events) == [0, 1, 3]
    assert {e["source"] for e in selection.events} == {2}
    learner.apply_selection(selection)
    for member in range(4):
        assert_same(member_of(learner.states, member), promoted)
    assert [h["actor_lr"] for h in learner.all_member_hparams()] == pytest.approx(rates)


# --- lineage ---


def test_ancestry_follows_copies_back_in_time():
    events = [
        {"env_steps": 100, "target": 1, "source": 0},
        {"env_steps": 200, "target": 0, "source": 2},
        {"env_steps": 300, "target": 3, "source": 1},
        {"env_steps": 300, "target": 2, "source": 3},  # after the line left member 2
    ]
    assert ancestry(events, 3, 400) == [
        Segment(0, 0, 100),
        Segment(1, 100, 300),
        Segment(3, 300, 400),
    ]
    assert ancestry([], 2, 50) == [Segment(2, 0, 50)]


def test_copy_jumps_read_both_members_returns_at_the_deciding_evaluation():
    rows = [
        {"eval_index": i, "member": m, "return_mean": 10.0 * i + m, "env_steps": 100 * (i + 1)}
        for i in range(2)
        for m in range(3)
    ]
    events = [
        {"eval_index": 1, "env_steps": 250, "target": 0, "source": 2},  # a PBT exploit
        {"eval_index": 1, "env_steps": 250, "target": 1, "source": 1},  # a halving trial
        {"eval_index": 5, "env_steps": 900, "target": 2, "source": 0},  # rows not written
    ]
    assert copy_jumps(rows, events) == [Jump(0, 250, 10.0, 12.0)]

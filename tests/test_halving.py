"""Successive halving inside one population: the rungs, ASHA's stopping rule, fresh trials with
fresh state, trials in the rows and the summary, resume mid-rung, and its config errors."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from fastpop.analysis.sweep import load_member_curves
from fastpop.run.resume import resume_run
from fastpop.run.run_files import read_metrics, summarize
from fastpop.strategies.base import Evaluation
from fastpop.strategies.halving import HalvingSettings, make_halving, rung_schedule
from fastpop.strategies.priors import Prior
from tests.helpers import refused_train
from tests.runs import TD3_PENDULUM
from tests.test_device_mode import rows, run
from tests.test_resume import learner_for, rows_for

PRIORS = {"actor_lr": Prior("log_uniform", 1e-4, 1e-2)}
PRIOR_TEXT = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-2]}}"


def test_rungs_are_geometric_below_the_total_and_may_be_empty():
    assert rung_schedule(1000, 3, 20_000) == (1000, 3000, 9000)
    assert rung_schedule(256, 2, 1024) == (256, 512)  # the total itself is no rung
    assert rung_schedule(1, 1.5, 10) == (1, 2, 3, 5, 8)  # 2.25 rounds to 2 again: once
    assert rung_schedule(20_000, 3, 20_000) == ()


def halving(size=4, rungs=(100, 300), seed=0):
    return make_halving(size, PRIORS, seed, HalvingSettings(rungs, 0.5, 100))


def hparams_of(size=4):
    return [{"actor_lr": 1e-3, "discount": 0.9 + m / 100} for m in range(size)]


def aged(index: int, steps: int, returns, ages) -> Evaluation:
    """A round whose members' trials had trained `ages` env steps at the snapshot (what the
    learner's clocks give: `Learner.snapshot_facts`)."""
    return Evaluation(index, steps, np.array(returns, float), trial_steps=np.array(ages))


def test_asha_stops_the_bottom_of_every_result_recorded_at_a_rung():
    strategy, hparams = halving(), hparams_of()
    state = strategy.init()
    assert [label["trial"] for label in strategy.member_labels(state)] == [0, 1, 2, 3]
    # Rung 0 (age 100): all four arrive together; the bottom half stops.
    state, selection = strategy.step(state, aged(0, 100, [1, 4, 2, 3], [100] * 4), hparams)
    np.testing.assert_array_equal(selection.fresh, [True, False, True, False])
    np.testing.assert_array_equal(selection.sources, np.arange(4))  # nobody copies anybody
    assert [(e["target"], e["stopped_trial"], e["trial"]) for e in selection.events] == [
        (0, 0, 4),
        (2, 2, 5),
    ]
    new = selection.hparams
    assert new[1] == hparams[1] and new[0]["discount"] == hparams[0]["discount"]
    assert 1e-4 <= new[0]["actor_lr"] <= 1e-2 and new[0]["actor_lr"] != new[2]["actor_lr"]
    assert [label["trial"] for label in strategy.member_labels(state)] == [4, 1, 5, 3]
    # Trials 4 and 5 reach rung 0 a round later, judged against all six results there:
    # 10 is the best of them; 0 is in the bottom three (2, 1, 0).
    state, selection = strategy.step(state, aged(1, 200, [10, 5, 0, 6], [100, 200, 100, 200]), new)
    assert [(e["target"], e["trial"], e["rung"]) for e in selection.events] == [(2, 6, 0)]
    # Trials 1 and 3 reach rung 1 (age 300): one of the two stops; trial 6 (started at 200)
    # reaches rung 0 with 1, among the bottom three of the seven results there.
    state, selection = strategy.step(state, aged(2, 300, [9, 5, 1, 6], [200, 300, 100, 300]), new)
    stops = [(e["target"], e["stopped_trial"], e["rung"], e["trial"]) for e in selection.events]
    assert stops == [(1, 1, 1, 7), (2, 6, 0, 8)]
    assert state.passed == (1, 0, 0, 2) and state.next_trial == 9


def test_a_nan_return_ranks_last_at_its_rung():
    strategy = halving()
    returns = np.array([np.nan, 4, 2, 3])
    _, selection = strategy.step(strategy.init(), Evaluation(0, 100, returns), hparams_of())
    np.testing.assert_array_equal(selection.fresh, [True, False, True, False])


def test_a_trial_is_judged_at_its_own_age_and_never_on_a_stopped_trials_snapshot():
    """The result of snapshot 1 comes back after trial 4 started in slot 0 (a lagging
    evaluator): the snapshot is trial 0's policy (slot 0's version then differs from now), so it
    counts for no trial; trial 4 reaches rung 0 when its own rows, not the run's steps since
    the decision, reach 100."""
    strategy, hparams = halving(), hparams_of()
    state, selection = strategy.step(
        strategy.init(), aged(0, 100, [1, 4, 2, 3], [100] * 4), hparams
    )
    versions_now = np.array([1, 0, 1, 0])  # the learner's, once trials 4 and 5 started
    stale = aged(1, 200, [99, 5, 99, 6], [200, 200, 200, 200])._replace(
        versions=np.zeros(4, int), versions_now=versions_now
    )
    state, selection = strategy.step(state, stale, selection.hparams)
    assert selection is None and state.results[0] == ((0, 1.0), (1, 4.0), (2, 2.0), (3, 3.0))
    young = aged(2, 300, [7, 5, 8, 6], [60, 300, 60, 300])  # 60 of their own rows in
    young = young._replace(versions=versions_now, versions_now=versions_now)
    state, _ = strategy.step(state, young, hparams)
    assert [trial for trial, _ in state.results[0]] == [0, 1, 2, 3]  # 4 and 5 not yet at 100
    assert state.results[1] == ((1, 5.0), (3, 6.0)) and state.trials == (4, 6, 5, 3)


def test_the_default_bottom_fraction_is_ashas_one_minus_one_over_the_reduction_factor():
    from fastpop import config as config_lib

    def stopped(*overrides: str) -> list[bool]:
        config = config_lib.load_config(TD3_PENDULUM, [*HALVING, "population.size=6", *overrides])
        strategy = config_lib.build_strategy(config)
        ages = [config.section("halving").first_rung] * 6
        _, selection = strategy.step(strategy.init(), aged(0, ages[0], range(6), ages),
                                     [{"actor_lr": 1e-3}] * 6)  # fmt: skip
        return selection.fresh.tolist()

    assert stopped("halving.reduction_factor=3") == [True] * 4 + [False] * 2  # 1 - 1/3
    assert stopped("halving.reduction_factor=2") == [True] * 3 + [False] * 3
    assert stopped("halving.reduction_factor=3", "halving.bottom_fraction=0.5").count(True) == 3


HALVING = [
    "strategy=halving",
    "halving.first_rung=16",
    "halving.reduction_factor=2",
    PRIOR_TEXT,
]


def feed(learner, chunks: range) -> None:
    """Rows and the updates they allow, without evaluation rounds."""
    for chunk in chunks:
        learner.insert(rows_for(learner, chunk))
        while learner.can_update():
            learner.update()


def actor_of(states, member: int) -> np.ndarray:
    return np.concatenate([leaf[member].ravel() for leaf in jax.tree.leaves(states.actor)])


def test_a_fresh_trial_starts_over_with_fresh_state_and_an_empty_replay():
    learner = learner_for(*HALVING)
    feed(learner, range(4))  # 32 env steps per member: every trial past its first rung
    before = jax.tree.map(np.asarray, learner.states)
    returns = np.array([3.0, 1.0, 2.0, 0.0])
    events, _ = learner.strategy_step(Evaluation(0, learner.limiter.inserted, returns))
    fresh = sorted(e["target"] for e in events)
    assert fresh == [1, 3] and all(e["kind"] == "trial" for e in events)
    after = jax.tree.map(np.asarray, learner.states)
    kept = [m for m in range(4) if m not in fresh]
    for m in kept:  # survivors bit for bit
        jax.tree.map(lambda a, b, m=m: np.testing.assert_array_equal(a[m], b[m]), after, before)
    for m in fresh:
        assert int(after.step[m]) == 0 < int(before.step[m])  # counters reset
        for other in range(4):  # new networks: unlike any member's before
            assert not np.allclose(actor_of(after, m), actor_of(before, other))
        assert int(learner.replay.buffers.size[m]) == 0  # its replay emptied
    labels = [label["trial"] for label in learner.member_labels()]
    assert sorted(labels[m] for m in fresh) == list(range(4, 4 + len(fresh)))
    # Its updates wait for replay.min_size (16) rows of its own: one chunk (8) is not enough.
    feed(learner, range(4, 5))
    waited = jax.tree.map(np.asarray, learner.states)
    for m in fresh:
        assert int(waited.step[m]) == 0
    assert all(int(waited.step[m]) > int(after.step[m]) for m in kept)
    feed(learner, range(5, 6))
    assert all(int(learner.states.step[m]) > 0 for m in fresh)


def test_device_mode_resumed_mid_rung_writes_the_rows_of_an_uninterrupted_run(tmp_path):
    settings = [*HALVING, "population.size=4", "halving.first_rung=256"]  # rungs 256, 512, 1024
    whole = run(tmp_path, "whole", "train.total_env_steps=2048", *settings)
    first = run(tmp_path, "resumed", "train.total_env_steps=1024", *settings)
    resume_run(first, ["train.total_env_steps=2048"], log=lambda message: None).run()
    assert rows(first) == rows(whole)
    evaluated = rows(whole)
    assert len(evaluated) == 4 * 4 and {r["member"] for r in evaluated} == {0, 1, 2, 3}
    trials = {r["trial"] for r in evaluated}
    assert {0, 1, 2, 3} < trials  # fresh trials were started and evaluated
    lineage = [json.loads(line) for line in (whole / "lineage.jsonl").read_text().splitlines()]
    assert trials - {0, 1, 2, 3} <= {e["trial"] for e in lineage}
    members = json.loads((whole / "members.json").read_text())["members"]
    assert [m["trial"] for m in members] == [0, 1, 2, 3]
    ranked = summarize(read_metrics(whole / "metrics.jsonl"))["trials"]
    assert sorted(t["trial"] for t in ranked) == sorted(trials)
    finals = [t["final_return"] for t in ranked]
    assert finals == sorted(finals, reverse=True)
    # The aggregate's curves are the slots, each naming the trials it ran, in order.
    slots = {curve.member: curve.config_label for curve in load_member_curves(whole)}
    for member in range(4):
        ran = list(dict.fromkeys(r["trial"] for r in evaluated if r["member"] == member))
        assert slots[member] == "trials " + ", ".join(map(str, ran))


def test_a_fresh_trials_rows_and_age_begin_with_the_rows_its_own_policy_collected():
    """Process mode: after trials 4 and 5 start in slots 1 and 3, chunks the collectors still
    send for the stopped trials (stamped with the old trial) are taken out of the emptied
    buffers again, and a trial's clock starts with its first chunk of its own rows (slot 3's
    collector takes its new trial up a chunk later than slot 1's). Halving judges each trial at
    that age, what it really trained on."""
    learner = learner_for(*HALVING)
    feed(learner, range(4))  # 32 env steps per member: every trial past its first rung
    learner.strategy_step(Evaluation(0, 32, np.array([3.0, 1.0, 2.0, 0.0])))
    trials, steps = learner.host_policy_tree()[2]
    assert trials.tolist() == [0, 1, 0, 1] and steps.tolist() == [32, 0, 32, 0]
    sizes = lambda: learner.replay.buffers.size.tolist()
    learner.insert(rows_for(learner, 4), np.array([0, 0, 0, 0]))  # the old trials' rows
    assert sizes()[1] == sizes()[3] == 0
    learner.insert(rows_for(learner, 5), np.array([0, 1, 0, 0]))  # slot 3: not yet
    learner.insert(rows_for(learner, 6), np.array([0, 1, 0, 1]))
    assert sizes()[1] == 16 and sizes()[3] == 8
    facts = learner.snapshot_facts()
    assert facts["trial_steps"] == [56, 16, 56, 8]
    ages = np.array(facts["trial_steps"])
    learner.strategy_step(Evaluation(1, 56, np.array([3.0, 1.0, 2.0, 0.0]), trial_steps=ages))
    at_first_rung = [trial for trial, _ in learner.strategy_state.results[0]]
    assert 4 in at_first_rung and 5 not in at_first_rung  # trial 5: 8 of its own steps


def test_a_trial_whose_state_is_not_finite_is_stopped_and_its_slot_starts_a_fresh_trial():
    """Not reset from the best member's state under its own trial id: it would carry that
    member's weights into its later rung comparisons."""
    learner = learner_for(*HALVING)
    feed(learner, range(1))  # 8 env steps: no trial at a rung
    broken = jax.tree.map(lambda leaf: leaf.at[1].set(np.nan) if leaf.dtype.kind == "f" else leaf,
                          learner.training.release(learner.states))  # fmt: skip
    learner.states = learner.training.adopt(broken)
    before = jax.tree.map(np.asarray, learner.states)
    events, _ = learner.strategy_step(Evaluation(0, 8, np.array([1.0, 2.0, 3.0, 4.0])))
    assert [(e["kind"], e["target"], e.get("reason"), e.get("trial")) for e in events] == [
        ("trial", 1, "non_finite", 4)
    ]
    assert learner.finite_members().all()
    after = jax.tree.map(np.asarray, learner.states)
    for other in (0, 2, 3):  # new networks, not another member's
        assert not np.allclose(actor_of(after, 1), actor_of(before, other))
    assert [label["trial"] for label in learner.member_labels()] == [0, 4, 2, 3]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["strategy=halving"], "population.priors: strategy halving draws the hparams"),
        ([*HALVING, "halving.bottom_fraction=1"], "halving.bottom_fraction: must be in (0, 1)"),
        ([*HALVING, "halving.bottom_fraction=0"], "halving.bottom_fraction: must be > 0"),
        ([*HALVING, "halving.first_rung=20000", "train.total_env_steps=20000"],
         "halving.first_rung: the rung schedule is empty"),
        ([*HALVING, "halving.reduction_factor=1"], "halving.reduction_factor: must be > 1"),
    ],
)  # fmt: skip
def test_bad_halving_configs_exit_2_naming_the_field(overrides, message, tmp_path, capsys):
    assert message in refused_train(tmp_path, capsys, TD3_PENDULUM, *overrides)

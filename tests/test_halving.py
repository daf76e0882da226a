"""Successive halving inside one population: the rungs, ASHA's stopping rule, fresh trials with
fresh state, trials in the rows and the summary, resume mid-rung, and its config errors."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from fastpop.analysis.sweep import load_member_curves
from fastpop.run.metrics import read_metrics, summarize
from fastpop.run.resume import resume_run
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


def test_asha_stops_the_bottom_of_every_result_recorded_at_a_rung():
    strategy, hparams = halving(), hparams_of()
    state = strategy.init()
    assert [label["trial"] for label in strategy.member_labels(state)] == [0, 1, 2, 3]
    # Rung 0 (age 100): all four arrive together; the bottom half stops.
    state, selection = strategy.step(state, Evaluation(0, 100, np.array([1.0, 4, 2, 3])), hparams)
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
    state, selection = strategy.step(state, Evaluation(1, 200, np.array([10.0, 5, 0, 6])), new)
    assert [(e["target"], e["trial"], e["rung"]) for e in selection.events] == [(2, 6, 0)]
    # Trials 1 and 3 reach rung 1 (age 300): one of the two stops; trial 6 (started at 200)
    # reaches rung 0 with 1, among the bottom three of the seven results there.
    state, selection = strategy.step(state, Evaluation(2, 300, np.array([9.0, 5, 1, 6])), new)
    stops = [(e["target"], e["stopped_trial"], e["rung"], e["trial"]) for e in selection.events]
    assert stops == [(1, 1, 1, 7), (2, 6, 0, 8)]
    assert state.passed == (1, 0, 0, 2) and state.next_trial == 9


def test_a_nan_return_ranks_last_at_its_rung():
    strategy = halving()
    returns = np.array([np.nan, 4, 2, 3])
    _, selection = strategy.step(strategy.init(), Evaluation(0, 100, returns), hparams_of())
    np.testing.assert_array_equal(selection.fresh, [True, False, True, False])


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

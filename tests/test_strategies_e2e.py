"""Runs of the pbt and branch_merge strategies: exploit rounds, lineage, plots. Trained in the
test's process: what is checked is the run's files (`fastpop train`'s own exit and stderr are
tests/test_train.py's)."""

from __future__ import annotations

import json

import pytest

from fastpop import config as config_lib
from fastpop.commands.cli import main
from fastpop.strategies.priors import parse_priors
from tests.helpers import train_here
from tests.runs import FAST, TD3_PENDULUM, read_jsonl

PRIORS = (
    "population.priors={actor_lr: {log_uniform: [1.0e-4, 3.0e-3]}, "
    "exploration_noise: {uniform: [0.05, 0.5]}, policy_delay: {int_uniform: [1, 3]}}"
)


def hparams_in_force(row: dict, initial: dict, events: list[dict]) -> dict:
    """What a member's hparams must be at an evaluation snapshot: those of the latest event that
    overwrote it before the snapshot, else its initial ones."""
    earlier = [
        e for e in events if e["target"] == row["member"] and e["wall_time"] < row["wall_time"]
    ]
    return max(earlier, key=lambda e: e["wall_time"])["new_hparams"] if earlier else initial


def test_pbt_run_exploits_and_writes_consistent_lineage(tmp_path):
    overrides = [
        *FAST,
        "strategy=pbt",
        PRIORS,
        "pbt.interval=400",
        "eval.interval=200",
        "pbt.wait=true",
        "train.total_env_steps=1900",  # no interval evaluation at the last env step
    ]
    run = train_here(tmp_path, TD3_PENDULUM, *overrides).run_dir
    config = config_lib.load_config(run / "config.yaml")
    priors = parse_priors(config.population.priors)
    members = json.loads((run / "members.json").read_text())
    assert members["strategy"] == "pbt"
    initial = {m["member"]: m["hparams"] for m in members["members"]}
    assert sorted(initial) == [0, 1, 2, 3]

    events = read_jsonl(run / "lineage.jsonl")
    rounds = sorted({e["round"] for e in events})
    # Rounds are due at 400, 800, 1200 and 1600 steps per member. The learner waits for each
    # evaluation, and the rate limiter lets collection run ~50 steps past it, so every round is
    # decided before training ends, however slow the evaluator (asynchronous PBT's last rounds
    # may come after training ended).
    assert rounds == [0, 1, 2, 3], rounds
    for number in rounds:
        in_round = [e for e in events if e["round"] == number]
        assert len(in_round) == 1  # a quarter of 4 members
        (event,) = in_round
        assert event["strategy"] == "pbt" and event["kind"] == "exploit"
        assert event["target"] != event["source"]
        assert event["member_env_steps"] >= 400 * (number + 1)
        assert event["env_steps"] >= event["member_env_steps"] * 4
        assert event["target_fitness"] <= event["source_fitness"]
        for name, prior in priors.items():
            value = event["new_hparams"][name]
            assert prior.clip(value) == value, (name, value)
        assert isinstance(event["new_hparams"]["policy_delay"], int)
    # Every evaluation row carries the hparams its member had at the snapshot.
    rows = read_jsonl(run / "metrics.jsonl")
    for row in rows:
        expected = hparams_in_force(row, initial[row["member"]], events)
        assert row["hparams"] == expected, (row["eval_index"], row["member"])

    assert main(["plot", "--hparams", str(run)]) == 0
    assert (run / "hparams.png").read_bytes()[:4] == b"\x89PNG"


def test_branch_merge_run_promotes_one_member_each_round(tmp_path):
    overrides = [
        *FAST,
        "strategy=branch_merge",
        "branch_merge.round_steps=500",
        "train.total_env_steps=1500",
    ]
    run = train_here(tmp_path, TD3_PENDULUM, *overrides).run_dir
    rows = read_jsonl(run / "metrics.jsonl")
    # Rounds end at the first chunk at or after 500 and 1000 steps, then the final evaluation.
    assert sorted({r["member_env_steps"] for r in rows}) == [512, 1024, 1504]
    events = read_jsonl(run / "lineage.jsonl")
    # The learner waits for each round's evaluation: both rounds are decided, and nothing after
    # the final evaluation.
    assert sorted({e["round"] for e in events}) == [0, 1]
    for number in (0, 1):
        in_round = [e for e in events if e["round"] == number]
        (promoted,) = {e["source"] for e in in_round}
        assert sorted(e["target"] for e in in_round) == sorted({0, 1, 2, 3} - {promoted})
        returns = {r["member"]: r["return_mean"] for r in rows if r["eval_index"] == number}
        assert returns[promoted] == max(returns.values())
    members = json.loads((run / "members.json").read_text())["members"]
    rates = [m["hparams"]["actor_lr"] for m in members]
    assert rates == pytest.approx([1e-4, 1e-3, 1e-3, 1e-3])  # the preset's 1e-3, one at 0.1x

"""`fastpop pbt-replay`: the hparam schedule of a PBT member's line from lineage.jsonl, the
`schedule` strategy that applies it, and a replay run whose evaluation rows show each change
from the round the schedule names; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.analysis.lineage import Segment
from fastpop.commands import cli
from fastpop.commands.pbt_replay import member_schedule
from fastpop.strategies.base import Evaluation
from fastpop.strategies.schedule import make_schedule
from tests.runs import FAST, TD3_PENDULUM, read_jsonl

SIZE = 4
INTERVAL = 256  # eval.interval (env steps per member)
BASE = {"actor_lr": 1e-3, "critic_lr": 1e-3, "policy_delay": 2}
INITIAL = [{**BASE, "actor_lr": lr} for lr in (1e-3, 2e-3, 3e-4, 4e-4)]


def event(round_steps: int, receipt_steps: int, target: int, source: int, **new) -> dict:
    """A PBT lineage row: decided on the evaluation snapshot at `round_steps` per member,
    applied (and logged) when the learner was at `receipt_steps` per member."""
    old, copied = INITIAL[target], INITIAL[source]
    return {
        "wall_time": receipt_steps / 100,
        "env_steps": receipt_steps * SIZE,
        "strategy": "pbt",
        "kind": "exploit",
        "eval_index": round_steps // INTERVAL - 1,
        "member_env_steps": round_steps,
        "target": target,
        "source": source,
        "old_hparams": old,
        "new_hparams": {**copied, **new},
    }


# Member 0's line at the end: member 1 until 288 (the round at 256 moved the line to member 2,
# which copied 1), then member 2 until 544 (the round at 512 moved it to member 0). Member 3's
# copy is on another line; the snapshots of the rounds were taken at 264 and 520.
EVENTS = [
    event(264, 288, 2, 1, actor_lr=2.4e-3),
    event(264, 288, 3, 1, actor_lr=1.6e-3),
    {**event(520, 544, 0, 2, actor_lr=3.6e-4, policy_delay=3), "old_hparams": INITIAL[0]},
]
EVENTS[2]["new_hparams"] = {**BASE, "actor_lr": 3.6e-4, "policy_delay": 3}
SCHEDULE = [
    {"member_env_steps": 256, "hparams": {"actor_lr": 2.4e-3}},
    {"member_env_steps": 512, "hparams": {"actor_lr": 3.6e-4, "policy_delay": 3}},
]


def test_the_schedule_follows_the_members_line_from_its_first_ancestor():
    start, changes, line = member_schedule(EVENTS, INITIAL, 0, 1024 * SIZE, SIZE, INTERVAL)
    assert line == [Segment(1, 0, 288 * SIZE), Segment(2, 288 * SIZE, 544 * SIZE),
                    Segment(0, 544 * SIZE, 1024 * SIZE)]  # fmt: skip
    assert start == INITIAL[1]  # the first ancestor's initial hparams
    assert changes == SCHEDULE  # only what changed, at the deciding round's step
    # A member never copied into keeps its initial hparams: an empty schedule.
    assert member_schedule(EVENTS, INITIAL, 1, 1024 * SIZE, SIZE, INTERVAL)[:2] == (INITIAL[1], [])
    # A copy after the end asked for is not on the line yet.
    start, changes, _ = member_schedule(EVENTS, INITIAL, 0, 500 * SIZE, SIZE, INTERVAL)
    assert (start, changes) == (INITIAL[0], [])


def test_a_reset_moves_the_line_without_changing_the_hparams():
    reset = {**event(776, 800, 3, 0), "kind": "reset", "new_hparams": INITIAL[3]}
    start, changes, line = member_schedule([*EVENTS, reset], INITIAL, 3, 2000 * SIZE, SIZE, 256)
    assert [s.member for s in line] == [1, 2, 0, 3]
    # From member 0's line (1, 2, 0), then member 3's own hparams back at the reset.
    assert start == INITIAL[1]
    back = {"member_env_steps": 768, "hparams": {"actor_lr": 4e-4, "policy_delay": 2}}
    assert changes == [*SCHEDULE, back]


def test_the_schedule_strategy_applies_each_change_from_its_round_on():
    strategy = make_schedule(2, SCHEDULE, INTERVAL)
    assert strategy.waits_for_evaluation and strategy.evaluation_interval == INTERVAL
    state, hparams = strategy.init(), [dict(INITIAL[1]), dict(INITIAL[1])]

    def round_at(steps):
        nonlocal state, hparams
        members = list(range(len(hparams)))
        evaluation = Evaluation(steps // INTERVAL, steps, np.zeros(len(members)))
        state, selection = strategy.step(state, evaluation, hparams)
        if selection is not None:  # nothing moves between members
            assert np.array_equal(selection.sources, members) and not selection.copy_replay
            assert [e["target"] for e in selection.events] == members
            hparams = selection.hparams
        return selection

    assert round_at(128) is None
    assert round_at(264) is not None and hparams[1] == {**INITIAL[1], "actor_lr": 2.4e-3}
    assert round_at(300) is None  # applied once
    round_at(544)
    assert hparams == [{**INITIAL[1], "actor_lr": 3.6e-4, "policy_delay": 3}] * 2
    # A late first round takes every change that is due, in order.
    strategy = make_schedule(1, SCHEDULE, INTERVAL)
    state, hparams = strategy.init(), [dict(INITIAL[1])]
    assert round_at(800).events[0]["scheduled_member_env_steps"] == 512
    assert hparams == [{**INITIAL[1], "actor_lr": 3.6e-4, "policy_delay": 3}]


def test_schedule_config_is_checked_and_round_trips(tmp_path):
    changes = "schedule.changes=[{member_env_steps: 256, hparams: {actor_lr: 2.4e-3}}]"
    one = ["strategy=schedule", "population.size=1", "collect.num_collectors=1"]
    config = config_lib.load_config(None, [*one, changes])
    changed = {"member_env_steps": 256, "hparams": {"actor_lr": 2.4e-3}}
    assert config.section("schedule").changes == (changed,)
    config_lib.save_config(config, tmp_path / "config.yaml")
    assert config_lib.load_config(tmp_path / "config.yaml") == config
    bad = [
        ("schedule.changes=[{member_env_steps: 5, hparams: {actr_lr: 1}}]",
         "did you mean 'schedule.changes[0].hparams.actor_lr'"),
        ("schedule.changes=[{member_env_steps: 5, hparams: {policy_delay: 1.5}}]",
         "schedule.changes[0].hparams.policy_delay: expected an integer"),
        ("schedule.changes=[{member_env_steps: 9, hparams: {tau: 1}}, "
         "{member_env_steps: 5, hparams: {tau: 1}}]",
         "schedule.changes[1].member_env_steps: must be >= the previous change's 9"),
        ("schedule.changes=[{hparams: {tau: 1}}]", "schedule.changes[0]: expected"),
        ("population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
         "population.grid and population.priors are for independent and pbt"),
    ]  # fmt: skip
    for override, message in bad:
        with pytest.raises(config_lib.ConfigError) as error:
            config_lib.load_config(None, ["strategy=schedule", override])
        assert message in str(error.value) and f"--set {override}" in str(error.value)


# --- a synthetic PBT run and its replay ---

TINY_RUN = [
    *FAST,
    f"eval.interval={INTERVAL}",
    "train.total_env_steps=1024",
    "log.tensorboard=false",
]


def write_pbt_run(run_dir: Path, *overrides: str) -> None:
    """config.yaml, members.json, metrics.jsonl and lineage.jsonl as a 4-member PBT run writes
    them (member 0 best at the end)."""
    priors = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-2]}}"
    config = config_lib.load_config(TD3_PENDULUM, [*TINY_RUN, "strategy=pbt", priors, *overrides])
    run_dir.mkdir()
    config_lib.save_config(config, run_dir / "config.yaml")
    members = [{"member": m, "hparams": h} for m, h in enumerate(INITIAL)]
    (run_dir / "members.json").write_text(json.dumps({"strategy": "pbt", "members": members}))
    rows = []
    for index, steps in enumerate((264, 520, 776, 1024)):
        for member in range(SIZE):
            rows.append(
                {"eval_index": index, "wall_time": steps / 100.0, "env_steps": steps * SIZE,
                 "member_env_steps": steps, "updates": steps, "member": member,
                 "return_mean": -1000.0 + 100 * index - 10 * member, "return_std": 1.0,
                 "episodes": 1, "hparams": INITIAL[member]}
            )  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "lineage.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))


def test_a_replay_run_applies_each_change_from_the_round_it_names(tmp_path, capsys):
    pbt_run = tmp_path / "pbt"
    write_pbt_run(pbt_run)
    assert cli.main(["pbt-replay", str(pbt_run)]) == 0  # best: member 0
    out = capsys.readouterr().out
    assert (
        "replaying member 0's line" in out and "1 (from 0) -> 2 (from 288) -> 0 (from 544)" in out
    )
    replay = tmp_path / "pbt_replay_member0"
    config = config_lib.load_config(replay / "config.yaml")
    assert (config.strategy, config.population.size) == ("schedule", 1)
    assert config.name == "td3_pendulum_cpu_replay_member0"
    assert config.hparams == {
        **config_lib.load_config(pbt_run / "config.yaml").hparams,
        **INITIAL[1],
    }
    assert list(config.section("schedule").changes) == SCHEDULE
    assert config.train.total_env_steps == 1024 and config.collect.num_collectors == 1
    rows = read_jsonl(replay / "metrics.jsonl")
    # The hparams of each evaluation round (recorded at its snapshot, before the strategy
    # step): the round at 256 decides the first change, in force from the round at 512 on.
    expected = {
        256: INITIAL[1],
        512: {**INITIAL[1], "actor_lr": 2.4e-3},
        768: {**INITIAL[1], "actor_lr": 3.6e-4, "policy_delay": 3},
        1024: {**INITIAL[1], "actor_lr": 3.6e-4, "policy_delay": 3},
    }
    assert [r["member_env_steps"] for r in rows] == [256, 512, 768, 1024]
    for row in rows:
        wanted = expected[row["member_env_steps"]]
        assert {k: row["hparams"][k] for k in wanted} == pytest.approx(wanted, rel=1e-6), row
    lineage = read_jsonl(replay / "lineage.jsonl")
    assert [
        (e["kind"], e["member_env_steps"], e["scheduled_member_env_steps"]) for e in lineage
    ] == [
        ("scheduled", 256, 256),
        ("scheduled", 512, 512),
    ]
    assert (replay / "replay_vs_pbt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {replay / 'replay_vs_pbt.png'}" in out


def test_bad_input_exits_2_and_starts_nothing(tmp_path, capsys):
    pbt_run = tmp_path / "pbt"
    write_pbt_run(pbt_run)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "metrics.jsonl").write_text("")
    cases = [
        ([str(tmp_path / "missing")], "run directory"),
        ([str(pbt_run), "--member", "7"], "--member 7: the run's population has 4 members (0..3)"),
        ([str(pbt_run), "--member", "top"], "--member 'top': expected best or a member index"),
        ([str(pbt_run), "--set", "train.total_env_step=5"],
         "unknown key 'train.total_env_step' in --set train.total_env_step=5"),
        ([str(pbt_run), "--out", str(tmp_path / "taken")], "already exists"),
    ]  # fmt: skip
    for argv, message in cases:
        assert cli.main(["pbt-replay", *argv]) == 2, argv
        assert message in capsys.readouterr().err, argv
    (pbt_run / "members.json").unlink()
    assert cli.main(["pbt-replay", str(pbt_run)]) == 2
    assert "members.json does not exist" in capsys.readouterr().err
    dvd = tmp_path / "dvd"
    dvd.mkdir()
    shared = config_lib.load_config(None, ["strategy=dvd", "replay.shared=true"])
    config_lib.save_config(shared, dvd / "config.yaml")
    assert cli.main(["pbt-replay", str(dvd)]) == 2
    assert "strategy dvd shares parameters between members" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dvd", "pbt", "taken"]


def test_a_replay_with_more_seeds_is_a_config_of_that_size(tmp_path):
    """--set population.size=N replays the schedule with N seeds (it was refused: the replay's
    config pinned population.seeds to 1)."""
    from fastpop.commands.pbt_replay import replay_config

    pbt_run = tmp_path / "pbt"
    write_pbt_run(pbt_run)
    replay = replay_config(pbt_run, "best", ["population.size=3", "collect.num_collectors=1"])
    assert (replay.config.population.size, replay.config.population.seeds) == (3, 3)

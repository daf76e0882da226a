"""`fastpop bench gpu`'s pbt rates: updates and env steps per member per second between
evaluation rows, with and without the seconds the learner spent evaluating in that window (the
rows' cumulative `learner_evaluation_seconds`), and the SAC PBT target showing both."""

from __future__ import annotations

import json

import pytest

from fastpop.bench.gpu_report import pbt_lines, pbt_target
from fastpop.bench.gpu_training import learning_rates


def write_rows(run_dir, rounds, size=2, timed=True):
    """metrics.jsonl of `rounds`: (wall_time, updates, member env steps, evaluation seconds)."""
    run_dir.mkdir()
    lines = []
    for index, (wall, updates, steps, seconds) in enumerate(rounds):
        for member in range(size):
            row = {"eval_index": index, "wall_time": wall, "env_steps": steps * size}
            row |= {"member_env_steps": steps, "updates": updates, "member": member}
            row |= {"return_mean": 1.0, "return_std": 0.0, "episodes": 2, "hparams": {}}
            if timed:
                row["learner_evaluation_seconds"] = seconds
            lines.append(json.dumps(row) + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(lines))


# before learning, then 10 s -> 30 s: 400 updates, 800 env steps, 5 - 1 = 4 s evaluating
ROUNDS = [(2.0, 0, 100, 0.0), (10.0, 100, 200, 1.0), (20.0, 300, 600, 3.0), (30.0, 500, 1000, 5.0)]
SUMMARY = {"learning_started_at": 5.0, "wall_time": 40.0, "updates_per_member": 600}


def test_rates_with_and_without_the_evaluation_pauses(tmp_path):
    write_rows(tmp_path / "run", ROUNDS)
    rates = learning_rates(tmp_path / "run", SUMMARY)
    assert rates == {
        "updates_per_member_per_s": 400 / 20,
        "member_env_steps_per_s": 800 / 20,
        "updates_per_member_per_s_without_evaluations": 400 / 16,
        "member_env_steps_per_s_without_evaluations": 800 / 16,
        "evaluation_seconds_in_window": 4.0,
        "rates_measured": "between evaluation rows",
    }


def test_rows_without_the_field_give_no_rate_without_evaluations(tmp_path):
    write_rows(tmp_path / "run", ROUNDS, timed=False)
    rates = learning_rates(tmp_path / "run", SUMMARY)
    assert rates["updates_per_member_per_s"] == 20.0
    assert rates["updates_per_member_per_s_without_evaluations"] is None
    assert rates["member_env_steps_per_s_without_evaluations"] is None
    # one row after the first update: over the whole time since, no rate without evaluations
    write_rows(tmp_path / "short", ROUNDS[:2])
    rates = learning_rates(tmp_path / "short", SUMMARY)
    assert rates["updates_per_member_per_s"] == pytest.approx(600 / 35)
    assert rates["updates_per_member_per_s_without_evaluations"] is None


def test_the_sac_pbt_target_shows_both_and_judges_the_one_with_pauses():
    run = {"population": 256, "env": "brax/ant", "updates_per_member_per_s": 1024 / 6.0}
    run |= {"updates_per_member_per_s_without_evaluations": 1024 / 4.0}
    name, measured, verdict = pbt_target({"runs": {"sac_pbt_brax_ant": run}})
    assert "evaluation pauses included" in name
    assert (
        measured == "6.00 s (171 updates/member/s); without evaluation pauses 4.00 s (not judged)"
    )
    assert verdict == "**missed**"  # 6 s > 5 s, although 4 s without the pauses
    run |= {"collect_mode": "device", "wall_seconds": 60.0, "member_env_steps": 2048}
    run |= {"updates_per_member": 4096, "rates_measured": "between evaluation rows"}
    run |= {"evaluation_seconds_in_window": 8.6, "plots": []}
    line = pbt_lines({"runs": {"sac_pbt_brax_ant": run}})[1]
    assert (
        "170.7 updates/member/s (between evaluation rows), 256.0 updates/member/s without" in line
    )
    assert "the 8.6 s spent evaluating in that window" in line

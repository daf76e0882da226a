"""`fastpop resume` end to end: a run killed with SIGKILL at an arbitrary moment continues from
its newest checkpoint, and every evaluation round is logged exactly once across the two
processes. Also what a resume refuses (exit code 2, nothing written)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from fastpop.commands import cli
from fastpop.run import checkpoint, resume
from tests.runs import (
    FAST,
    SIZE,
    START_SECONDS,
    STOP_SECONDS,
    TD3_PENDULUM,
    assert_clean_stderr,
    read_jsonl,
)

CHECKPOINT_STEPS = 500


def wait_for_checkpoints(directory, count: int, trainer) -> list:
    deadline = time.monotonic() + START_SECONDS
    while len(found := checkpoint.complete_checkpoints(directory)) < count:
        if trainer.process.poll() is not None:
            pytest.fail(f"the run ended early:\n{trainer.stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {count} checkpoints after {START_SECONDS}s:\n{trainer.stdout}")
        time.sleep(0.05)
    return found


def test_sigkill_then_resume_continues_from_the_newest_checkpoint_and_logs_each_round_once(
    trainers,
):
    trainer = trainers(
        TD3_PENDULUM,
        *FAST,
        "train.total_env_steps=10_000_000",
        "eval.interval=250",
        f"checkpoint.interval_env_steps={CHECKPOINT_STEPS}",
        "strategy=pbt",
        "pbt.interval=500",
        "pbt.wait=true",  # rounds before the kill and after the resume, however slow the evaluator
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
    )
    wait_for_checkpoints(trainer.out / "checkpoints", 2, trainer)
    os.killpg(trainer.pid, signal.SIGKILL)  # the whole run, wherever it is
    assert trainer.wait(STOP_SECONDS) == -signal.SIGKILL
    newest = checkpoint.complete_checkpoints(trainer.out / "checkpoints")[0]
    newest_as_given = newest.relative_to(trainer.workdir)  # the run was named relatively
    rows_before = read_jsonl(trainer.out / "metrics.jsonl")

    target = int(newest.name) + 1000
    resumed = trainers(None, f"train.total_env_steps={target}", resume=True)
    assert resumed.wait(START_SECONDS) == 0, resumed.stderr
    assert_clean_stderr(resumed.stderr)
    assert (
        f"resumed from {newest_as_given}: {int(newest.name):,} env steps per member"
        in resumed.stdout
    )

    rows = read_jsonl(trainer.out / "metrics.jsonl")
    rounds = Counter((row["eval_index"], row["member"]) for row in rows)
    assert max(rounds.values()) == 1, "an evaluation row was logged twice"
    last = max(index for index, _ in rounds)
    assert set(rounds) == {(i, m) for i in range(last + 1) for m in range(SIZE)}, "missing rows"
    steps = [row["member_env_steps"] for row in rows if row["member"] == 0]
    assert steps == sorted(steps) and steps[-1] >= target
    wall = [row["wall_time"] for row in rows if row["member"] == 0]
    assert wall == sorted(wall), "wall time continues from the saved total"
    # Rows logged before the kill and kept are unchanged by the resume.
    kept = {(r["eval_index"], r["member"]): r for r in rows}
    for row in rows_before:
        if (row["eval_index"], row["member"]) in kept and row["member_env_steps"] < int(
            newest.name
        ):
            assert kept[(row["eval_index"], row["member"])] == row
    lineage = Counter(
        (e["eval_index"], e["target"]) for e in read_jsonl(trainer.out / "lineage.jsonl")
    )
    assert lineage and max(lineage.values()) == 1, "a round was logged twice"
    events = read_jsonl(trainer.out / "events.jsonl")
    assert [e["path"] for e in events if e["kind"] == "resumed"] == [str(newest_as_given)]
    completed = [e for e in events if e["kind"] == "checkpoint" and e["reason"] == "completed"]
    assert completed and completed[-1]["member_env_steps"] >= target


def run_cli(*args: str) -> int:
    return cli.main(list(args))


def test_resume_refuses_what_it_cannot_do_and_writes_nothing(tmp_path, capsys):
    assert run_cli("resume", str(tmp_path / "missing")) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert run_cli("resume", str(tmp_path)) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_full_disk_stops_the_run_clearly_and_keeps_the_newest_checkpoint(trainers):
    # Bytes per file: the first checkpoint's arrays (no replay; ~86 KB, and ~26 KB more for each
    # policy snapshot still waiting for the evaluator: at most two here) fit; a later one's,
    # holding more of them as the evaluator lags, or the metrics fill it. (At eval.interval=64
    # the first checkpoint, written at the warm-up's end before the first update compiles,
    # held four: ~160 KB.)
    limit = 120 * 1024
    trainer = trainers(
        TD3_PENDULUM,
        *FAST,
        "train.total_env_steps=10_000_000",
        "eval.interval=128",
        "checkpoint.interval_env_steps=128",
        "checkpoint.replay=false",
        "log.tensorboard=false",
        "log.progress_interval_seconds=600",
        "collect.ring_slots=4",
        "replay.samples_per_insert=4",  # little learning: the evaluation rows come faster
        file_size_limit=limit,
        # Without its own cache: a cache entry cut short by the limit would poison the shared
        # one for the rest of the session.
        environment={"JAX_ENABLE_COMPILATION_CACHE": "false"},
    )
    assert trainer.wait(START_SECONDS) == 1, trainer.stderr
    assert_clean_stderr(trainer.stderr)
    directory = trainer.out / "checkpoints"
    newest = checkpoint.complete_checkpoints(directory)[0]
    assert "fastpop: error: stopping: the disk is full ([Errno 27] File too large" in (
        trainer.stderr
    )
    assert f"newest complete checkpoint: {newest.relative_to(trainer.workdir)}" in trainer.stderr
    assert (trainer.out / "metrics.jsonl").stat().st_size <= limit
    assert not list(directory.glob(".tmp-*"))
    resumed = resume.resume_run(trainer.out, [], log=lambda *_: None)
    assert resumed.member_env_steps == int(newest.name)

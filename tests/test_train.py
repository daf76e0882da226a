"""`fastpop train` end to end: outputs, rate limiting, signals, dying workers, bad input, crashes.

Runs that need exit codes or signals are `python -m fastpop train` subprocesses in their own
session (so a failing test can still remove everything it started); every run is shortened with
`--set` to a few seconds of training on tiny networks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from fastpop import config as config_lib
from fastpop.commands import cli, run_directory
from fastpop.learn import learner as learner_lib
from fastpop.run import checkpoint, loop, resume
from fastpop.run.parts import build_run
from fastpop.run.stop_signals import STOP_SIGNALS, StopSignals
from tests.runs import (
    DQN_CARTPOLE,
    ENDLESS,
    FAST,
    SIZE,
    START_SECONDS,
    STOP_SECONDS,
    TD3_PENDULUM,
    TOLERANCE,
    assert_clean_stderr,
    descendants,
    read_jsonl,
    segments,
    survivors,
)

# --- end to end ---


def check_run_dir(run_dir: Path, config: Path, overrides: list[str], member_steps: list[int]):
    """The files of a completed run; `member_steps`: per-member env steps of each evaluation."""
    assert config_lib.load_config(run_dir / "config.yaml") == config_lib.load_config(
        config, overrides
    )
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert len(rows) == SIZE * len(member_steps), [
        (r["eval_index"], r["member_env_steps"]) for r in rows
    ]
    rounds = [rows[i : i + SIZE] for i in range(0, len(rows), SIZE)]
    for index, (group, steps) in enumerate(zip(rounds, member_steps, strict=True)):
        assert [row["member"] for row in group] == list(range(SIZE))
        assert {row["eval_index"] for row in group} == {index}
        assert {row["member_env_steps"] for row in group} == {steps}
        assert {row["env_steps"] for row in group} == {steps * SIZE}
        assert len({row["wall_time"] for row in group}) == 1
        assert all(isinstance(row["return_mean"], float) for row in group)
    wall_times = [group[0]["wall_time"] for group in rounds]
    assert all(a < b for a, b in itertools.pairwise(wall_times)), wall_times
    updates = [group[0]["updates"] for group in rounds]
    assert updates == sorted(updates) and updates[-1] > 0

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "completed"
    assert summary["member_env_steps"] == member_steps[-1]
    target = summary["samples_per_insert_target"]
    assert target == 32
    # The limiter keeps sampled/inserted within tolerance * target once the data that flowed
    # dwarfs one chunk plus one update call (here ~1200 transitions vs (32*32 + 10*32) / 32 / 0.2).
    assert abs(summary["samples_per_insert_achieved"] - target) <= TOLERANCE * target + 1e-9
    assert summary["updates_per_member"] > 0
    assert set(summary["workers"]) == {"collector 0", "collector 1"}
    for name in ("walltime_vs_return.png", "steps_vs_return.png"):
        assert (run_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # What train --overwrite may replace: everything in it is a name fastpop writes there.
    assert run_directory.is_run_directory(run_dir)
    assert run_directory.foreign_entries(run_dir) == []
    return summary


GRID = "population.grid={actor_lr: [3.0e-4, 1.0e-3], policy_delay: [1, 2]}"


@pytest.mark.parametrize(
    "config,steps,member_steps,extra",
    [
        # Interval evaluations at the first chunk at or after 750 and 1500 (768, 1504); the run
        # ends at 1504, which the last one already evaluated: no second, final round.
        pytest.param(TD3_PENDULUM, (1500, 750), [768, 1504], [], id="td3-pendulum"),
        # The same loop with the sequential executor (one flag), members from a 2 x 2 grid.
        pytest.param(
            TD3_PENDULUM,
            (1500, 750),
            [768, 1504],
            ["population.execution=sequential", GRID],
            id="td3-pendulum-sequential-grid",
        ),
        # Evaluations at 640 and 1280, and a final one at the end (1504).
        pytest.param(DQN_CARTPOLE, (1500, 640), [640, 1280, 1504], [], id="dqn-cartpole"),
    ],
)
def test_train_end_to_end(trainers, tmp_path, config, steps, member_steps, extra):
    overrides = [*FAST, f"train.total_env_steps={steps[0]}", f"eval.interval={steps[1]}", *extra]
    trainer = trainers(config, *overrides)
    assert trainer.wait(START_SECONDS) == 0, trainer.stderr
    assert_clean_stderr(trainer.stderr)
    check_run_dir(trainer.out, config, overrides, member_steps)
    assert not segments(trainer.pid)
    assert sorted(os.listdir(tmp_path)) == ["run", "stderr.txt", "stdout.txt"]
    if GRID in extra:  # members in grid order, recorded in the run and in every evaluation row
        grid = [(lr, delay) for lr in (3e-4, 1e-3) for delay in (1, 2)]
        members = json.loads((trainer.out / "members.json").read_text())["members"]
        recorded = [(m["hparams"]["actor_lr"], m["hparams"]["policy_delay"]) for m in members]
        assert recorded == [(pytest.approx(lr), delay) for lr, delay in grid]
        for row in read_jsonl(trainer.out / "metrics.jsonl"):
            assert row["hparams"] == members[row["member"]]["hparams"]
        assert "members ranked by final evaluation return" in trainer.stdout


# --- signals and dying workers ---


def assert_stop_checkpoint(run_dir: Path, reason: str) -> None:
    """The run's newest checkpoint was written at the stop, for `reason`, and restores."""
    newest = checkpoint.complete_checkpoints(run_dir / "checkpoints")[0]
    assert checkpoint.read_manifest(newest)["metadata"]["run"]["reason"] == reason
    events = read_jsonl(run_dir / "events.jsonl")
    assert [e["reason"] for e in events if e["kind"] == "checkpoint"][-1] == reason
    assert resume.resume_run(run_dir, [], log=lambda *_: None).member_env_steps > 0


@pytest.mark.parametrize(
    "signum,to_group",
    [
        pytest.param(signal.SIGINT, True, id="SIGINT-to-the-process-group"),  # Ctrl-C
        pytest.param(signal.SIGTERM, False, id="SIGTERM-to-the-trainer"),  # kill PID
    ],
)
def test_signal_stops_the_run_and_cleans_up(trainers, signum, to_group, capsys):
    trainer = trainers(TD3_PENDULUM, *FAST, *ENDLESS)
    trainer.wait_until_training()
    children = descendants(trainer.pid)
    assert len(trainer.collectors(2)) == 2
    assert segments(trainer.pid), "a training run holds shared memory"
    if signum == signal.SIGTERM:  # a live run's directory is not written by anyone else
        for command in (["resume"], ["train", str(TD3_PENDULUM), "--overwrite", "--out"]):
            assert cli.main([*command, str(trainer.out)]) == 2
            assert "is in use by another fastpop process" in capsys.readouterr().err
    start = time.monotonic()
    (os.killpg if to_group else os.kill)(trainer.pid, signum)
    if to_group:  # delivered twice, as a wrapper (timeout, a batch system) may: one stop
        os.kill(trainer.pid, signum)
    code = trainer.wait(STOP_SECONDS)
    assert time.monotonic() - start < STOP_SECONDS
    assert code == 128 + signum, trainer.stderr  # the shell's convention
    assert_clean_stderr(trainer.stderr)
    reason = "interrupted" if signum == signal.SIGINT else "terminated"
    assert f"stopping: {reason}" in trainer.stdout
    assert not survivors(children)
    assert not segments(trainer.pid)
    summary = json.loads((trainer.out / "summary.json").read_text())
    assert summary["stopped_by"] == reason
    assert_stop_checkpoint(trainer.out, reason)
    # Collectors report their stats only when they stop cleanly, on the learner's request.
    assert set(summary["workers"]) == {"collector 0", "collector 1"}


def test_trainer_killed_by_sigkill_leaves_no_orphans(trainers):
    """The learner gets no chance to clean up: its workers notice on their own and exit, then
    the resource tracker removes the segments."""
    trainer = trainers(TD3_PENDULUM, *FAST, *ENDLESS, "collect.ring_slots=2")
    trainer.wait_until_training()
    children = descendants(trainer.pid)
    assert len(trainer.collectors(2)) == 2
    os.kill(trainer.pid, signal.SIGSTOP)
    time.sleep(2.0)  # the collectors fill their two ring slots (~0.1 s) and wait on a full ring
    os.kill(trainer.pid, signal.SIGKILL)
    assert trainer.wait(STOP_SECONDS) == -signal.SIGKILL
    assert not survivors(children, seconds=STOP_SECONDS)
    deadline = time.monotonic() + STOP_SECONDS
    while segments(trainer.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not segments(trainer.pid)


def test_killed_collector_is_restarted_and_the_run_completes(trainers):
    # Four ring slots: the run cannot finish on what the dead collector left in its ring, so it
    # completes only if the restarted collector delivers.
    trainer = trainers(
        TD3_PENDULUM,
        *FAST,
        "train.total_env_steps=1500",
        "eval.interval=750",
        "collect.ring_slots=4",
    )
    trainer.wait_until_training()
    victim = trainer.collectors(2)[1]
    os.kill(victim, signal.SIGKILL)
    assert trainer.wait(START_SECONDS) == 0, trainer.stderr
    assert_clean_stderr(trainer.stderr)
    assert "collector 1 died (killed by SIGKILL); restarting it (1/3)" in trainer.stdout
    events = read_jsonl(trainer.out / "events.jsonl")
    restarts = [event for event in events if event["kind"] == "worker_restart"]
    assert len(restarts) == 1, events
    assert restarts[0]["worker"] == "collector 1"
    assert restarts[0]["reason"] == "killed by SIGKILL"
    assert restarts[0]["restart"] == 1
    summary = json.loads((trainer.out / "summary.json").read_text())
    assert summary["stopped_by"] == "completed" and summary["member_env_steps"] == 1504
    assert len(read_jsonl(trainer.out / "metrics.jsonl")) == SIZE * 2
    assert not segments(trainer.pid)


def test_killed_evaluator_is_restarted_and_no_evaluation_is_lost(trainers):
    trainer = trainers(TD3_PENDULUM, *FAST, "train.total_env_steps=1500", "eval.interval=750")
    trainer.wait_until_training()
    evaluator = trainer.workers(2)[-1]
    os.kill(evaluator, signal.SIGKILL)
    assert trainer.wait(START_SECONDS) == 0, trainer.stderr
    assert "evaluator died (killed by SIGKILL); restarting it (1/3)" in trainer.stdout
    rows = read_jsonl(trainer.out / "metrics.jsonl")
    # Every round is logged exactly once, whether or not the killed evaluator held a snapshot.
    assert sorted(row["eval_index"] for row in rows) == sorted([0, 1] * SIZE)
    assert not segments(trainer.pid)


def test_collector_dying_beyond_max_restarts_fails_the_run(trainers):
    trainer = trainers(TD3_PENDULUM, *FAST, *ENDLESS, "collect.max_restarts=0")
    trainer.wait_until_training()
    children = descendants(trainer.pid)
    victim = trainer.collectors(2)[0]
    start = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code = trainer.wait(STOP_SECONDS)
    assert time.monotonic() - start < STOP_SECONDS
    assert code == 1, trainer.stderr
    assert "fastpop: error: collector 0 died (killed by SIGKILL)" in trainer.stderr
    assert "collect.max_restarts" in trainer.stderr
    assert_clean_stderr(trainer.stderr)
    assert_stop_checkpoint(trainer.out, "worker failed")
    assert not survivors(children)
    assert not segments(trainer.pid)


# --- input refused before anything starts ---


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["replay.capcity=5"], "unknown key 'replay.capcity'"),
        (["env.id=Pendulum-v99"], "env.id: unknown environment 'Pendulum-v99'"),
        (
            ["replay.capacity=1_000_000_000", "population.size=1000"],
            "lower replay.capacity or population.size",
        ),
    ],
    ids=["unknown-key", "unknown-env", "replay-too-large"],
)
def test_bad_input_exits_2_and_creates_nothing(trainers, tmp_path, overrides, message):
    trainer = trainers(TD3_PENDULUM, *overrides, out="results/runs/bad")
    assert trainer.wait(60) == 2
    assert trainer.stderr.startswith("fastpop: error: "), trainer.stderr
    assert message in trainer.stderr
    assert "Traceback" not in trainer.stderr
    assert sorted(os.listdir(tmp_path)) == ["stderr.txt", "stdout.txt"]  # no run directory


def test_ctrl_c_while_the_run_is_built_exits_130_and_creates_nothing(tmp_path, monkeypatch, capsys):
    """Building a run (the population's first compile) can take a while: Ctrl-C then is a
    stop, said in one line, not a traceback."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop.Run, "__init__", interrupted)
    out = tmp_path / "run"
    assert cli.main(["train", str(TD3_PENDULUM), "--out", str(out)]) == 130
    assert capsys.readouterr().err == "stopping: interrupted\n"
    assert not out.exists()


@pytest.mark.parametrize(
    "found",
    [signal.SIG_IGN, signal.SIG_DFL, signal.default_int_handler, lambda signum, frame: None],
    ids=["SIG_IGN", "SIG_DFL", "default_int_handler", "a-handler-of-its-own"],
)
def test_stop_signals_put_back_the_handlers_they_found(found):
    """A run started with SIGINT ignored (`nohup`, a background job) or with a handler of its
    caller's leaves exactly that behind."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        signal.signal(signal.SIGINT, found)
        signals = StopSignals()
        with signals:
            assert signal.getsignal(signal.SIGINT) == signals._on_signal
            assert signal.getsignal(signal.SIGTERM) == signals._on_signal
        assert signal.getsignal(signal.SIGINT) is found
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# --- a crash in the learner ---


def test_an_interrupt_swallowed_by_a_callback_still_stops_the_run(tmp_path, monkeypatch):
    """Python prints and drops an exception raised while it runs a gc callback (XLA has one):
    a Ctrl-C landing there must still stop the run, which then puts back the SIGINT handler it
    found (SIG_IGN in a background job or under nohup, Python's default_int_handler otherwise)."""
    found = signal.getsignal(signal.SIGINT)
    config = config_lib.load_config(TD3_PENDULUM, [*FAST, *ENDLESS])
    real_update = learner_lib.Learner.update
    calls = []

    def update_with_a_dropped_interrupt(self):
        real_update(self)
        calls.append(None)
        if len(calls) == 2:
            with contextlib.suppress(KeyboardInterrupt):  # what the callback machinery does
                run.signals._on_signal(signal.SIGINT, None)
        if len(calls) > 20:
            raise RuntimeError("the run went on after the interrupt")

    monkeypatch.setattr(learner_lib.Learner, "update", update_with_a_dropped_interrupt)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = loop.Run(build_run(config), run_dir, log=lambda message: None)
    summary = run.run()
    assert summary["stopped_by"] == "interrupted"
    assert len(calls) == 2
    assert signal.getsignal(signal.SIGINT) is found


def test_learner_crash_propagates_and_leaves_nothing_behind(tmp_path, monkeypatch):
    config = config_lib.load_config(TD3_PENDULUM, [*FAST, *ENDLESS])
    real_update = learner_lib.Learner.update
    calls, workers_at_crash, segments_at_crash = [], [], set()

    def failing_update(self):
        real_update(self)
        calls.append(None)
        if len(calls) == 3:
            workers_at_crash.extend(mp.active_children())
            segments_at_crash.update(segments(os.getpid()))
            raise RuntimeError("learner blew up")

    monkeypatch.setattr(learner_lib.Learner, "update", failing_update)
    handler = signal.getsignal(signal.SIGTERM)
    before = segments(os.getpid())
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = loop.Run(build_run(config), run_dir, log=lambda message: None)
    with pytest.raises(RuntimeError, match="learner blew up"):
        run.run()
    assert {p.name for p in workers_at_crash} >= {
        "fastpop-collector-0",
        "fastpop-collector-1",
        "fastpop-evaluator",
    }
    assert mp.active_children() == []
    assert all(p.exitcode is not None for p in workers_at_crash)
    assert segments_at_crash - before, "the run held shared memory when it crashed"
    assert segments(os.getpid()) == before
    assert signal.getsignal(signal.SIGTERM) is handler

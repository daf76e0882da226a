"""While a call of the training loop outlasts `log.progress_interval_seconds` (the first update
compiling, a checkpoint, the final evaluation), the run says what it is doing and for how long."""

from __future__ import annotations

import re
import time

import pytest

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.learn import learner as learner_lib
from fastpop.population import chunking, tuning_cache
from fastpop.run import loop
from fastpop.run.evaluation_rounds import EvaluationRounds
from fastpop.run.parts import build_learner, build_run
from fastpop.run.phases import PhaseWatch
from fastpop.run.progress import format_breakdown, late_evaluations_line
from tests.runs import FAST, TD3_PENDULUM


def test_a_long_phase_is_reported_every_interval_and_when_done():
    lines: list[str] = []
    with PhaseWatch(lines.append, 0.1) as watch, watch.phase("compiling the population update"):
        # until three reports (a fixed sleep saw two on a loaded machine), at most 10 s
        deadline = time.monotonic() + 10
        while sum(" ... " in line for line in lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    reports = [line for line in lines if " ... " in line]
    assert len(reports) >= 3, lines
    seconds = [float(re.fullmatch(r"compiling the population update \.\.\. (\S+)s", r)[1])
               for r in reports]  # fmt: skip
    assert seconds == sorted(seconds) and seconds[0] >= 0.1
    # (a loaded machine may take over a second to see three reports: any number of seconds)
    assert re.fullmatch(r"compiling the population update: done in \d+\.\ds", lines[-1]), lines
    quiet: list[str] = []
    with PhaseWatch(quiet.append, 30.0) as watch, watch.phase("quick"):
        time.sleep(0.02)  # far shorter than its interval, however loaded the machine: nothing said
    assert quiet == []


def test_nested_phases_report_the_inner_one_and_the_thread_stops():
    lines: list[str] = []
    with PhaseWatch(lines.append, 0.05) as watch, watch.phase("outer"):
        with watch.phase("inner"):
            time.sleep(0.2)
        thread = watch._thread
    assert lines[0].startswith("inner ... ") and any(x.startswith("inner: done") for x in lines)
    assert thread is not None and not thread.is_alive()


def test_a_slow_first_update_is_reported_while_it_runs(tmp_path, monkeypatch):
    """A run whose first update takes 1.5 s (as compiling or measuring does on a CPU) with
    progress lines every 0.2 s: the log says the first update runs, and for how long."""
    overrides = [*FAST, "train.total_env_steps=384", "eval.interval=10000"]
    config = config_lib.load_config(TD3_PENDULUM, [*overrides, "log.tensorboard=false"])
    real_update = learner_lib.Learner.update
    calls = []

    def slow_first_update(self):
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(1.5)
        real_update(self)

    monkeypatch.setattr(learner_lib.Learner, "update", slow_first_update)
    lines: list[str] = []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = loop.Run(build_run(config), run_dir, log=lines.append).run()
    assert summary["stopped_by"] == "completed" and len(calls) > 1
    # Named by what it waits for (its programs were compiled during the warm-up, maybe still)
    phase = next(line for line in lines if line.startswith("first population update")).split(
        " ... "
    )[0]
    reports = [line for line in lines if line.startswith(f"{phase} ... ")]
    assert len(reports) >= 4, lines  # 1.5 s at least, reported every 0.2 s
    done = lines.index(next(line for line in lines if line.startswith(f"{phase}: done in")))
    assert lines.index(reports[-1]) < done
    assert float(re.search(r"done in (\S+)s", lines[done])[1]) >= 1.5
    # The later updates are quick: nothing more is said about them.
    assert not any(line.startswith("population update") for line in lines)


def test_the_first_update_is_named_by_what_it_waits_for(monkeypatch):
    """Measuring members per chunk (a CPU, a population past one vmap's size, in a benchmark:
    a run measures after its first calls), compiling (no program made ahead) or nothing more
    than the update (compiled during the warm-up)."""
    monkeypatch.setattr(tuning_cache, "_memory", {})
    monkeypatch.setenv("FASTPOP_CACHE_DIR", "")  # this process only: nothing measured before
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    config = config_lib.load_config(TD3_PENDULUM, FAST)
    monkeypatch.setattr(chunking, "SMALL_POPULATION_BYTES", 0)
    monkeypatch.setattr(chunking, "_measure_later", False)  # as `fastpop bench` sets it
    learner = build_learner(config)
    assert learner.update_phase(first=True) == (
        "first population update (measuring members per chunk on this CPU)"
    )
    monkeypatch.setattr(chunking, "_measure_later", True)  # a run's: its first update waits not
    learner = build_learner(config)
    assert learner.update_phase(first=True) == "first population update (compiling)"
    monkeypatch.setenv(chunking.CHUNK_ENV, "2")
    learner = build_learner(config)
    assert learner.update_phase(first=True) == "first population update (compiling)"
    learner.compile_update_ahead()
    learner.calls.ahead.result()
    assert learner.update_phase(first=True) == "first population update"
    # A later update: named only where it measures members per chunk (chunking.py).
    assert learner.update_phase(first=False) == "population update"
    monkeypatch.setattr(learner.training.update, "measures_again", lambda hparams: True)
    assert learner.update_phase(first=False) == (
        "population update (measuring members per chunk on this CPU)"
    )


SLOW_SNAPSHOT_SECONDS = 1.0  # well above what moving this run's rows takes (~0.2 s here)


SLOW_UPDATE_SECONDS = 0.1  # an update's compute, waited for after its asynchronous dispatch


def test_the_time_breakdown_counts_an_evaluation_snapshot_once(tmp_path, monkeypatch):
    """Snapshots are taken in the pass that moves rows into the replay: their seconds go to
    evaluation_snapshots only (transport counted them too, so the phases summed past the wall).
    The host's waits for an update's compute are counted in `update_wait` (they were in no
    timer: the host waited inside the copy of the new policies to the collectors), and rows
    move while an update runs."""
    # No progress line mid-run: each waits for the update in flight, and on a loaded machine,
    # where a pass of the loop outlasts a short interval, every update then waited before the
    # next (seen: "iiiiiiiiiuuiwuwuwuiwuwuwuiwuw", the suite taking 978 s).
    overrides = [*FAST, "train.total_env_steps=384", "eval.interval=128"]
    overrides += ["log.progress_interval_seconds=1000", "log.tensorboard=false"]
    config = config_lib.load_config(TD3_PENDULUM, overrides)
    real_encode, encoded = snapshot.encode, []

    def slow_encode(*args):
        time.sleep(SLOW_SNAPSHOT_SECONDS)
        encoded.append(args)
        return real_encode(*args)

    monkeypatch.setattr(snapshot, "encode", slow_encode)
    real_wait, waits = learner_lib.Learner.wait_for_update, []
    Learner, order = learner_lib.Learner, []

    def slow_wait(self):
        time.sleep(SLOW_UPDATE_SECONDS)
        waits.append(self.updates)
        order.append("wait")
        real_wait(self)

    def noted(name, method):
        return lambda self, *args: (order.append(name), method(self, *args))[1]

    monkeypatch.setattr(Learner, "wait_for_update", slow_wait)
    monkeypatch.setattr(Learner, "update", noted("update", Learner.update))
    monkeypatch.setattr(Learner, "insert", noted("insert", Learner.insert))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = loop.Run(build_run(config), run_dir, log=lambda line: None).run()
    timers, in_loop = summary["learner_seconds"], 3  # at 128, 256 and 384 member env steps
    assert len(encoded) >= in_loop
    assert timers["evaluation_snapshots"] >= in_loop * SLOW_SNAPSHOT_SECONDS
    assert timers["transport"] < 2 * SLOW_SNAPSHOT_SECONDS, timers  # was >= 3 x 1 s
    assert waits and timers["update_wait"] >= len(waits) * SLOW_UPDATE_SECONDS, (waits, timers)
    # Rows move while an update runs: inserted after its dispatch, and the next update
    # dispatched without a wait between (fastpop.run.update_pipeline).
    steps = "".join({"update": "u", "wait": "w", "insert": "i"}[name] for name in order)
    assert re.search("ui+u", steps), steps
    assert sum(timers.values()) == pytest.approx(summary["wall_time"], abs=0.01)  # with `other`


def test_the_time_breakdown_names_device_mode_phases_by_what_they_time():
    summary = {
        "wall_time": 10.0,
        "learner_seconds": {
            "transport": 6.0,
            "update_wait": 0.0,
            "publish_write": 0.5,
            "evaluation_snapshots": 3.0,
        },
        "workers": {},
        "samples_per_insert_target": 256.0,
        "samples_per_insert_achieved": 256.0,
    }
    process = format_breakdown(summary | {"collect_mode": "processes"}).splitlines()
    assert re.fullmatch(r"  learner publish_write +0\.5s +5\.0%", process[3]), process
    device = format_breakdown(summary | {"collect_mode": "device"}).splitlines()
    assert re.fullmatch(r"  learner transport +6\.0s +60\.0%", process[1]), process
    assert "asynchronously" in device[1]
    assert re.fullmatch(r"  learner chunk calls +6\.0s +60\.0%", device[2]), device
    assert re.fullmatch(r"  learner evaluations +3\.0s +30\.0%", device[3]), device
    # nothing to publish in device mode, and its updates run inside its chunk calls
    assert not any("publish" in line or "update" in line for line in device)


def test_the_breakdown_says_when_no_update_ran_instead_of_nan():
    summary = {"wall_time": 1.0, "learner_seconds": {}, "workers": {}}
    summary |= {"samples_per_insert_target": 32.0, "samples_per_insert_achieved": float("nan")}
    last = format_breakdown(summary | {"updates_per_member": 0}).splitlines()[-1]
    assert last == (
        "  samples per insert: no update ran (they start once replay.min_size transitions per "
        "member are in), 32.0 target"
    )
    last = format_breakdown(summary | {"updates_per_member": 3}).splitlines()[-1]
    assert last == (
        "  samples per insert: none measured (nothing inserted since learning started), 32.0 target"
    )
    last = format_breakdown(summary | {"samples_per_insert_achieved": 31.25}).splitlines()[-1]
    assert last == "  samples per insert: 31.2 achieved, 32.0 target"


def test_a_run_that_ends_before_learning_starts_says_no_update_ran(tmp_path):
    config = config_lib.load_config(TD3_PENDULUM, [*FAST, "train.total_env_steps=128"])
    assert config.replay.min_size > 128
    lines: list[str] = []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = loop.Run(build_run(config), run_dir, log=lines.append).run()
    assert summary["updates_per_member"] == 0
    breakdown = lines[-1].splitlines()
    assert breakdown[-1].startswith("  samples per insert: no update ran"), breakdown
    assert "nan" not in lines[-1]


def test_a_run_says_how_many_evaluations_came_back_after_training_ended(tmp_path, monkeypatch):
    """An evaluator slower than the whole run (every result held back until training ends):
    the asynchronous PBT run makes no round, and says so, naming pbt.wait."""
    overrides = [*FAST, "train.total_env_steps=384", "eval.interval=128", "strategy=pbt"]
    overrides += ["pbt.interval=128", "population.priors={actor_lr: {uniform: [1.0e-4, 1.0e-3]}}"]
    config = config_lib.load_config(TD3_PENDULUM, [*overrides, "log.tensorboard=false"])
    receive = EvaluationRounds.receive
    held = lambda self, timeout=0.0: receive(self, timeout) if self.training_done else None
    monkeypatch.setattr(EvaluationRounds, "receive", held)
    lines: list[str] = []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    loop.Run(build_run(config), run_dir, log=lines.append).run()
    # Snapshots at 128 and 256 env steps per member, then the final one at 384.
    assert (
        "2 evaluation(s) taken during training came back after it ended: the pbt strategy made "
        "no step on them (pbt.wait: true makes the learner wait for each)"
    ) in lines
    assert not (run_dir / "lineage.jsonl").read_text()
    assert late_evaluations_line(0, "pbt") is None
    assert late_evaluations_line(3, "independent") is None  # no step to make
    assert late_evaluations_line(1, "halving") == (
        "1 evaluation(s) taken during training came back after it ended: the halving strategy "
        "made no step on them"
    )

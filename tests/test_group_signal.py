"""A stop signal sent to the run's whole process group (GNU `timeout`, a job scheduler) kills
the workers too: the run stops, and restarts none of them on its way out, whether the signal
lands during an update or while rows are moved into the replay."""

from __future__ import annotations

import signal
import time

import pytest

from fastpop import config as config_lib
from fastpop.learn import learner as learner_lib
from fastpop.run import loop
from fastpop.run.parts import build_run
from tests.runs import ENDLESS, FAST, TD3_PENDULUM


def signal_the_group(run) -> None:
    """What a group SIGTERM does: every worker dies, the trainer's handler records it."""
    workers = run.collection.workers.processes
    processes = [p for p in (*workers.collectors, workers.evaluator) if p is not None]
    for process in processes:
        process.terminate()  # SIGTERM
    run.signals._on_signal(signal.SIGTERM, None)
    deadline = time.monotonic() + 30
    while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("during", ["update", "insert"])
def test_workers_killed_with_the_trainer_are_not_restarted(tmp_path, monkeypatch, during):
    config = config_lib.load_config(TD3_PENDULUM, [*FAST, *ENDLESS])
    real_method = getattr(learner_lib.Learner, during)
    calls = []

    def method_while_the_group_is_signalled(self, *args):
        real_method(self, *args)
        calls.append(None)
        if len(calls) == 2:
            signal_the_group(run)
        if len(calls) > 20:
            raise RuntimeError("the run went on after the signal")

    monkeypatch.setattr(learner_lib.Learner, during, method_while_the_group_is_signalled)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines: list[str] = []
    run = loop.Run(build_run(config), run_dir, log=lines.append)
    summary = run.run()
    assert summary["stopped_by"] == "terminated" and len(calls) == 2
    assert not [line for line in lines if "restarting" in line], lines
    assert "worker_restart" not in (run_dir / "events.jsonl").read_text()

"""A stop signal sent to the run's whole process group (GNU `timeout`, a job scheduler) kills
the workers too: the run stops, and restarts none of them on its way out."""

from __future__ import annotations

import signal
import time

from fastpop import config as config_lib
from fastpop.learn import learner as learner_lib
from fastpop.run import loop
from fastpop.run.parts import build_run
from tests.runs import ENDLESS, FAST, TD3_PENDULUM


def test_workers_killed_with_the_trainer_during_an_update_are_not_restarted(tmp_path, monkeypatch):
    config = config_lib.load_config(TD3_PENDULUM, [*FAST, *ENDLESS])
    real_update = learner_lib.Learner.update
    calls = []

    def update_while_the_group_is_signalled(self):
        real_update(self)
        calls.append(None)
        if len(calls) == 2:  # the signal reaches every process of the group during an update
            workers = run.collection.workers
            processes = [*workers.collectors, workers.evaluator]
            for process in processes:
                process.terminate()  # SIGTERM
            run.signals._on_signal(signal.SIGTERM, None)  # the trainer's handler records it
            deadline = time.monotonic() + 30
            while any(p.exitcode is None for p in processes) and time.monotonic() < deadline:
                time.sleep(0.01)
        if len(calls) > 20:
            raise RuntimeError("the run went on after the signal")

    monkeypatch.setattr(learner_lib.Learner, "update", update_while_the_group_is_signalled)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines: list[str] = []
    run = loop.Run(build_run(config), run_dir, log=lines.append)
    summary = run.run()
    assert summary["stopped_by"] == "terminated" and len(calls) == 2
    assert not [line for line in lines if "restarting" in line], lines
    assert "worker_restart" not in (run_dir / "events.jsonl").read_text()

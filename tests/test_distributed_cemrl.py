"""CEM-RL under `--distributed`: its population is the CEM mean plus mirrored pairs (an odd
size) split evenly over the devices, so three processes x 1 forced CPU device train one
population of 3 on gymnax's Pendulum (the shared critic and replay replicated on all three, the
refit on the gathered actors). Stopped at 256 env steps per member and resumed, the rows equal
one process's on one device, uninterrupted, to float rounding; then process 1 is killed and
both others stop, each naming it (process 0, whose service the others talk to, last)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.dependencies import require
from tests.helpers import train_here
from tests.runs import read_jsonl
from tests.test_distributed import (
    LOST_SECONDS,
    RUN_SECONDS,
    Processes,
    assert_rows_once,
    wait_for_a_round_after_resume,
)
from tests.test_distributed_device import OVERRIDES, PRESET

require("gymnax")

pytestmark = pytest.mark.xdist_group("distributed")  # one worker runs every subprocess group

CEMRL = [*OVERRIDES, "strategy=cemrl", "population.size=3", "cemrl.generation_steps=256"]
SETTINGS = [arg for override in CEMRL for arg in ("--set", override)]


def three(workdir, args: list[str], tag: str) -> Processes:
    return Processes(workdir, args, count=3, tag=tag, devices=1)


def test_three_processes_train_cemrl_resume_match_one_process_and_stop_together(tmp_path):
    args = ["train", str(PRESET), "--out", "run", *SETTINGS, "--set", "train.total_env_steps=256"]
    first = three(tmp_path, args, "first")
    try:
        codes = first.wait(RUN_SECONDS)
    finally:
        first.cleanup()
    assert codes == [0, 0, 0], first.output(0)[-3000:] + first.output(1)[-3000:]
    metrics = tmp_path / "run" / "metrics.jsonl"
    before = len(read_jsonl(metrics))
    resumed = three(tmp_path, ["resume", "run", "--set", "train.total_env_steps=100000"], "resumed")
    try:
        wait_for_a_round_after_resume(resumed, metrics, before, size=3)
        os.kill(resumed.processes[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        survivors = [resumed.processes[index].wait(LOST_SECONDS + 10) for index in (0, 2)]
        stopped_in = time.monotonic() - killed
    finally:
        resumed.cleanup()
    assert survivors == [1, 1] and stopped_in < LOST_SECONDS, resumed.output(2)[-3000:]
    for index in (0, 2):  # not aborted by JAX's client when process 0's service went away
        assert "process 1 of the distributed run is gone" in resumed.output(index)

    (tmp_path / "one").mkdir()
    reference = train_here(tmp_path / "one", PRESET, *CEMRL, "train.total_env_steps=512")
    expected = read_jsonl(reference.run_dir / "metrics.jsonl")
    rows = assert_rows_once(tmp_path / "run", size=3)[: len(expected)]
    assert len(expected) == 2 * 3  # an evaluation every 256 steps
    key = lambda rows: [(r["eval_index"], r["member"], r["env_steps"], r["updates"]) for r in rows]
    assert key(rows) == key(expected)
    returns = lambda rows: [row["return_mean"] for row in rows]
    np.testing.assert_allclose(returns(rows), returns(expected), rtol=1e-4)

"""Device mode, DvD and a shared replay under `--distributed`: two processes x 2 forced CPU
devices train one DvD population of 4 on gymnax's Pendulum (each process stepping its own
members' env lanes; the shared critic and replay on every device of both); the rows equal one
process's on one device to float rounding (the critic's gradients are summed over the processes'
devices in another order). Stopping and resuming in device mode, and a process killed there, are
tested with CEM-RL on three processes (tests/test_distributed_cemrl.py): one run of two
processes here, to keep the suite's distributed tests within their share of its time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.dependencies import require
from tests.helpers import train_here
from tests.runs import REPO, read_jsonl
from tests.test_distributed import (
    RUN_SECONDS,
    Processes,
    assert_rows_once,
)

require("gymnax")

pytestmark = pytest.mark.xdist_group("distributed")  # one worker runs every subprocess pair

PRESET = REPO / "configs" / "td3_gymnax_pendulum_cpu.yaml"
OVERRIDES = [
    "population.size=4",
    "population.devices=all",
    "agent.hidden_sizes=[16,16]",
    "agent.batch_size=32",
    "replay.samples_per_insert=4",  # every update all-reduces the critic over both processes
    "replay.min_size=128",
    "collect.warmup_steps=128",
    "collect.chunk_len=16",
    "train.updates_per_call=16",
    "eval.interval=256",
    "eval.episodes=2",
    "env.episode_length=100",
    "log.tensorboard=false",
    "strategy=dvd",  # a shared critic: its gradients all-reduced over both processes
    "replay.shared=true",  # rows of both processes' members, on every device
]


def settings(*overrides: str) -> list[str]:
    return [arg for override in [*OVERRIDES, *overrides] for arg in ("--set", override)]


def run_pair(workdir: Path, args: list[str], tag: str) -> None:
    pair = Processes(workdir, args, tag=tag)
    try:
        codes = pair.wait(RUN_SECONDS)
    finally:
        pair.cleanup()
    assert codes == [0, 0], pair.output(0)[-3000:] + pair.output(1)[-3000:]


@pytest.fixture(scope="module")
def distributed(tmp_path_factory) -> Path:
    """The distributed run to 512 env steps per member."""
    workdir = tmp_path_factory.mktemp("distributed-device")
    args = ["train", str(PRESET), "--out", "run", *settings("train.total_env_steps=512")]
    run_pair(workdir, args, "first")
    return workdir / "run"


def without_wall_time(path: Path) -> list[dict]:
    timings = ("wall_time", "learner_evaluation_seconds")  # differ from run to run
    return [{k: v for k, v in row.items() if k not in timings} for row in read_jsonl(path)]


def test_two_processes_train_dvd_on_the_device_and_match_one_process(distributed, tmp_path):
    # The same run uninterrupted on this process's one device (population.devices: all).
    reference = train_here(tmp_path, PRESET, *OVERRIDES, "train.total_env_steps=512").run_dir
    rows = assert_rows_once(distributed)
    assert max(row["member_env_steps"] for row in rows) == 512
    expected = without_wall_time(reference / "metrics.jsonl")
    assert len(rows) == len(expected) == 2 * 4  # an evaluation every 256 steps
    count = lambda rows: [
        (r["eval_index"], r["member"], r["env_steps"], r["updates"]) for r in rows
    ]
    assert count(rows) == count(expected)
    returns = lambda rows: [row["return_mean"] for row in rows]
    np.testing.assert_allclose(returns(rows), returns(expected), rtol=1e-4)
    summary = json.loads((distributed / "summary.json").read_text())
    assert summary["stopped_by"] == "completed" and summary["collect_mode"] == "device"
    (newest, *_) = sorted((distributed / "checkpoints").iterdir(), reverse=True)
    manifest = json.loads((newest / "manifest" / "metadata").read_text())
    assert manifest["topology"] == {"processes": 2, "devices": 4}

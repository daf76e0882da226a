"""Shared-memory segments: the CPU check, owner names, and reclaiming what killed runs left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.collect import segments
from fastpop.collect.segments import (
    Owner,
    WeakMemoryOrderError,
    memory_order_problem,
    own_owner,
    parse_owner,
    reclaim_orphaned_segments,
    segment_name,
)
from fastpop.collect.shm import ChunkRing, ParamChannel, StopFlag
from fastpop.collect.workers import WorkerFailed, Workers
from fastpop.config.build import build_env_spec, build_replay_spec
from fastpop.run.parts import process_parts
from tests.runs import FAST, START_SECONDS, TD3_PENDULUM, assert_clean_stderr
from tests.runs import segments as run_segments
from tests.shm_leaks import leftovers, shm_entries

# --- weakly ordered CPUs ---


@pytest.mark.parametrize("machine", ["x86_64", "AMD64", "i686", "x86"])
def test_x86_has_the_memory_order_the_channels_need(machine):
    assert memory_order_problem(machine) is None


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "armv7l", "ppc64le", "riscv64", ""])
def test_weakly_ordered_or_unknown_cpus_are_refused_with_the_reason(machine):
    problem = memory_order_problem(machine)
    assert problem is not None
    assert "x86" in problem and "reorder" in problem
    assert (machine or "unknown architecture") in problem


def test_on_arm_no_channel_is_created_or_attached_and_workers_refuse_to_start(monkeypatch):
    with ParamChannel.create([np.zeros(3, np.float32)]) as existing:
        monkeypatch.setattr(segments.platform, "machine", lambda: "aarch64")
        before = shm_entries()
        for create in (
            lambda: ParamChannel.create([np.zeros(3, np.float32)]),
            lambda: ChunkRing.create({"x": np.zeros(2)}, 2, 0),
            StopFlag.create,
            lambda: ParamChannel.attach(existing.spec),
        ):
            with pytest.raises(WeakMemoryOrderError, match="aarch64"):
                create()
        assert shm_entries() == before
        config = config_lib.config_from_dict(
            {"name": "arm", "algo": "td3", "env": {"id": "Pendulum-v1"}}
        )
        env_spec = build_env_spec(config)
        replay_spec = build_replay_spec(config, env_spec)
        with pytest.raises(WorkerFailed, match="total store order"):
            Workers(process_parts(config, env_spec), [np.zeros(3, np.float32)], replay_spec)


def test_on_arm_a_process_mode_run_is_refused_before_its_directory_exists(
    monkeypatch, tmp_path, capsys
):
    from fastpop.commands.cli import main

    monkeypatch.setattr(segments.platform, "machine", lambda: "aarch64")
    out = tmp_path / "run"
    assert main(["train", str(TD3_PENDULUM), "--out", str(out)]) == 2
    assert "total store order" in capsys.readouterr().err and not out.exists()


# --- owners and reclaim ---


def _ticks_of(pid: int) -> int:
    return segments._proc_stat(pid)[1]


def test_segment_names_record_pid_namespace_and_start_time():
    owner = own_owner()
    assert owner.pid == os.getpid() and owner.start == _ticks_of(os.getpid()) > 0
    assert owner.namespace == os.stat("/proc/self/ns/pid").st_ino
    name = segment_name()
    assert name.startswith(f"fastpop_{os.getpid()}_")
    assert parse_owner(name) == owner
    assert parse_owner("fastpop_123_0badcafe") == Owner(123, None, None)  # before owners
    for other in ("sem.mp-abc", "fastpop_notes", "fastpop_1_2_3", "psm_1234"):
        assert parse_owner(other) is None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_reclaim_removes_only_segments_whose_creator_is_provably_gone(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", ""])
    try:
        deadline = time.monotonic() + 10
        while segments._proc_stat(zombie.pid)[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)  # exited, not reaped yet
        me, dead, namespace = own_owner(), _dead_pid(), own_owner().namespace
        expected = {
            segment_name(me): True,  # this process
            segment_name(Owner(me.pid, namespace, me.start + 1)): False,  # its pid, reused
            segment_name(Owner(dead, namespace, 12345)): False,
            segment_name(Owner(sleeper.pid, namespace, _ticks_of(sleeper.pid))): True,
            segment_name(Owner(zombie.pid, namespace, _ticks_of(zombie.pid))): False,
            segment_name(Owner(dead, namespace + 1, 12345)): True,  # another pid namespace
            f"fastpop_{dead}_0badcafe": False,  # a name from before owners were recorded
            f"fastpop_{sleeper.pid}_0badcafe": True,  # created after its live owner started
            "sem.mp-abcdefgh": True,  # not ours to judge
            "fastpop_notes": True,
        }
        for name in expected:
            (tmp_path / name).write_bytes(b"\0" * 64)
        removed = reclaim_orphaned_segments(tmp_path)
        assert sorted(removed) == sorted(name for name, kept in expected.items() if not kept)
        assert {p.name for p in tmp_path.iterdir()} == {n for n, kept in expected.items() if kept}
    finally:
        sleeper.kill()
        sleeper.wait()
        zombie.wait()


# --- a run killed as a whole ---


def test_a_run_killed_as_a_whole_leaves_no_semaphores_and_its_segments_go_at_the_next_start(
    trainers,
):
    before = shm_entries()
    run = trainers(TD3_PENDULUM, *FAST, "train.total_env_steps=10_000_000", "eval.interval=500")
    run.wait_until_training()
    assert run_segments(run.pid)
    os.killpg(run.pid, signal.SIGKILL)  # learner, workers and resource tracker together
    assert run.wait(10) == -signal.SIGKILL
    assert run_segments(run.pid), "nothing is left to unlink them"
    assert not [name for name in leftovers(before, wait=1.0) if name.startswith("sem.mp-")]
    following = trainers(TD3_PENDULUM, *FAST, "train.total_env_steps=512", out="following")
    assert following.wait(START_SECONDS) == 0, following.stderr
    assert_clean_stderr(following.stderr)
    assert not run_segments(run.pid)
    # Every fastpop run reclaims at its start: under pytest-xdist another worker's run may
    # have started between the kill and `following` and reclaimed them first.
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) == 1:
        assert "shared-memory segment(s) of killed fastpop runs" in following.stdout

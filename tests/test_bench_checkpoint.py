"""`fastpop bench checkpoint`: a tiny run writes its JSON, and bad input exits 2."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from fastpop.bench import checkpoint as bench_checkpoint
from fastpop.bench.checkpoint_timing import trees_equal
from fastpop.commands import bench as bench_commands

CONFIG = Path(__file__).parents[1] / "configs" / "td3_pendulum_cpu.yaml"
TINY = [
    str(CONFIG),
    "--set",
    "population.size=2",
    "--set",
    "replay.capacity=256",
    "--set",
    "replay.min_size=4",
    "--repeats",
    "1",
]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fastpop")
    bench_commands.add_checkpoint_parser(parser.add_subparsers(dest="bench"))
    return bench_commands.run_checkpoint(parser.parse_args(["checkpoint", *argv]))


def test_tiny_benchmark_writes_sizes_times_and_round_trips(tmp_path, capsys):
    checkpoints = tmp_path / "checkpoints"
    assert run([*TINY, "--dir", str(checkpoints), "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "checkpoint_td3_pendulum_cpu_cpu.json").read_text())
    rows = {row["replay"]: row for row in result["results"]}
    assert set(rows) == {"on", "off"}
    for row in rows.values():
        assert row["bytes"] > 0 and row["save_seconds"]["min"] > 0
        assert row["restore_seconds"]["median"] > 0
        assert row["round_trip_equal"]  # restored learner == saved learner, leaf by leaf
    # The buffers: 2 members x 256 transitions of Pendulum (obs 3, action 1, reward, 4 flags).
    replay_bytes = 2 * 256 * (4 * 3 + 4 + 4 + 4)
    assert rows["on"]["bytes"] - rows["off"]["bytes"] >= replay_bytes
    assert result["population"] == 2 and result["replay_capacity_per_member"] == 256
    assert result["command"].startswith(f"fastpop bench checkpoint {CONFIG} --set population")
    assert list(checkpoints.iterdir()) == []  # what the benchmark wrote is gone
    assert "replay" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no_such.yaml"], "config file no_such.yaml does not exist"),
        (["--replay", "on,maybe"], "--replay: unknown setting 'maybe'; choose from on, off"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(argv, message, tmp_path, capsys):
    assert run([*argv, "--out", str(tmp_path)]) == 2
    assert f"fastpop: error: {message}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_round_trip_check_sees_one_changed_value_and_dtype():
    tree = {"w": np.arange(4.0, dtype=np.float32), "key": jax.random.key(0), "nan": np.nan}
    assert trees_equal(tree, dict(tree))
    assert not trees_equal(tree, {**tree, "w": np.float32([0, 1, 2, 4])})
    assert not trees_equal(tree, {**tree, "w": np.arange(4.0)})  # float64
    assert not trees_equal(tree, {**tree, "key": jax.random.key(1)})


def test_refuses_a_checkpoint_larger_than_the_free_disk(tmp_path):
    with pytest.raises(ValueError, match=r"only .* GB is free there; choose another --dir"):
        bench_checkpoint.check_disk(tmp_path, 10**18)

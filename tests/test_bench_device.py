"""`fastpop bench device`: a tiny run on gymnax's Pendulum-v1 writes its JSON and PNG with every
measurement positive, process mode on gymnasium's Pendulum-v1 included (no timing asserts: the
machine is shared); a gymnasium --env, a brax-only --backend, an algorithm the actions do not fit
and a --process-env that cannot run in process mode are refused with exit 2. (The benchmark
is one code path for every device family; gymnax programs compile in a second, brax's in tens.)"""

from __future__ import annotations

import json

import pytest

from tests.dependencies import require
from tests.helpers import run_bench

require("gymnax")

TINY = ["--pop", "2", "--envs-per-member", "2", "--seconds", "0.05", "--chunk-len", "8"]
TINY += ["--hidden-sizes", "16,16"]


def run(argv: list[str]) -> int:
    return run_bench(["device", *argv])


def test_tiny_device_benchmark_writes_every_measurement(tmp_path, capsys):
    argv = ["--env", "gymnax/Pendulum-v1", *TINY, "--out", str(tmp_path)]
    assert run(argv) == 0
    result = json.loads((tmp_path / "device_gymnax_Pendulum-v1_cpu.json").read_text())
    assert (tmp_path / "device_gymnax_Pendulum-v1_cpu.png").stat().st_size > 0
    assert result["env"] == "gymnax/Pendulum-v1" and result["backend"] is None
    assert result["algo"] == "td3" and result["shapes"] == {"obs": 3, "actions": 1}
    assert result["command"].startswith("fastpop bench device --env gymnax/Pendulum-v1 --pop 2")
    assert result["updates_per_call"] == 8 and result["samples_per_insert"] == 256
    (row,) = result["rows"]
    assert (row["population"], row["envs_per_member"]) == (2, 2)
    assert row["fused"]["env_steps_per_s"] > 0 and row["fused"]["agent_updates_per_s"] > 0
    for name in ("collect_alone", "env_alone"):
        assert row[name]["env_steps_per_s"] > 0 and row[name]["seconds_per_call"] > 0
    assert row["update_alone"]["agent_updates_per_s"] > 0
    compile_names = {"build", "fused", "rollout", "warm_up", "env", "update_alone"}
    assert set(row["compile_seconds"]) == compile_names
    assert all(seconds >= 0 for seconds in row["compile_seconds"].values())
    assert row["compile_seconds"]["warm_up"] > 0
    assert row["ratios"]["updates_per_env_step"] == pytest.approx(1.0)  # samples_per_insert
    assert all(value > 0 for value in row["ratios"].values())
    assert row["programs_compiled"] == {"collect": 1, "update": 1, "rollout": 1}  # no recompiles
    # beside it, process mode on gymnasium's Pendulum-v1 at the same P, E and ratio
    assert result["process_env"] == "Pendulum-v1"
    process = row["process_mode"]
    assert (process["env"], process["collectors"]) == ("Pendulum-v1", 2)
    assert process["env_steps_per_s"] > 0 and process["agent_updates_per_s"] > 0
    assert process["agent_updates_per_s"] == pytest.approx(process["env_steps_per_s"], rel=0.5)
    assert row["ratios"]["fused_env_steps_vs_process_mode"] > 0
    assert "| 2 | 2 |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--env", "Pendulum-v1"], "--env Pendulum-v1: device mode steps JAX environments (brax/"),
        (["--env", "gymnax/Pendulum-v1", "--backend", "spring"], "only brax environments"),
        (["--env", "gymnax/CartPole-v1", "--algo", "sac"], "has discrete actions: use dqn"),
        (["--env", "gymnax/Pendulum-v1", "--algo", "dqn"], "continuous actions: use td3 or sac"),
        (["--env", "gymnax/CartPol-v1"], "did you mean gymnax/CartPole-v1"),
    ],
)
def test_an_env_or_algorithm_device_mode_cannot_bench_is_refused(tmp_path, capsys, argv, expected):
    assert run([*argv, "--out", str(tmp_path)]) == 2
    assert expected in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("process_env", "expected"),
    [("HalfCheeta-v5", "did you mean HalfCheetah-v5"), ("brax/ant", "collect.mode: processes")],
)
def test_a_process_env_that_cannot_run_in_process_mode_is_refused(
    tmp_path, capsys, process_env, expected
):
    argv = ["--env", "gymnax/Pendulum-v1", "--process-env", process_env]
    assert run([*argv, "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert f"--process-env {process_env}:" in error and expected in error
    assert not list(tmp_path.iterdir())


def test_the_env_alone_ceiling_compiles_once():
    """gymnax's resets are weakly typed and its steps are not: the env-alone program's first
    state must be typed as its output, or its second call compiles again (and the reported
    compile seconds, first call minus second, come out near 0)."""
    from fastpop.bench.device import EnvAlone
    from fastpop.envs.device_envs import make_device_env

    env_alone = EnvAlone(make_device_env("gymnax/CartPole-v1"), lanes=4, steps=8)
    for _ in range(3):
        env_alone()
    assert env_alone.run._cache_size() == 1

"""population.devices: members split over several devices give the one-device numbers, and what
cannot be split is refused (exit 2) naming the fix.

The multi-device checks run in ONE subprocess (tests/sharding_cases.py) with 4 forced host CPU
devices: the device count must be set before JAX starts, and compiling is most of their time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from fastpop.commands import cli
from fastpop.config import ConfigError, config_from_dict, load_config, save_config
from tests import sharding_cases

# Its module fixture is expensive: one worker runs it once for every test here.
pytestmark = pytest.mark.xdist_group("sharding")

ROOT = Path(__file__).resolve().parent.parent
# Both sides of every comparison compile with these, so they only make the compiles faster
# (about half the time of this file on a 2-core CPU); the partitioning itself is XLA's HLO pass.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


@pytest.fixture(scope="module")
def sharded_results() -> dict:
    flags = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}"
    env = {
        **os.environ,  # the persistent compilation cache of tests/conftest.py included
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=4".strip(),
    }
    completed = subprocess.run(
        [sys.executable, "-m", "tests.sharding_cases"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", sharding_cases.CHECKS)
def test_members_split_over_four_devices_match_one_device(sharded_results, check):
    """TD3 with PBT (replay copied), SAC, DQN, CEM-RL and DvD learners with population.devices
    > 1 end with the member states, hparams, strategy states and buffers of the same learners on
    one device, after the same updates and strategy rounds; so does device mode (gymnax envs
    stepped by each member's device); where arrays live, that the update sends nothing between
    devices, that a copy moves only the changed members."""
    assert sharded_results[check] == "ok", sharded_results[check]


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    return str(error.value)


def test_a_size_that_does_not_split_evenly_is_refused_naming_the_fix():
    message = refusal(["population.size=6", "population.devices=4"])
    assert message.startswith("population.devices: population.size (6) must split evenly")
    assert "population.devices to a divisor of 6" in message
    assert "population.size to a multiple of 4" in message
    cemrl = ["strategy=cemrl", "replay.shared=true", "population.size=5", "population.devices=2"]
    assert "use an odd device count" in refusal(cemrl)


def test_sequential_execution_stays_on_one_device():
    for devices in ("2", "all"):
        message = refusal(["population.execution=sequential", f"population.devices={devices}"])
        assert "set population.devices: 1 or population.execution: vectorized" in message


@pytest.mark.parametrize("value", ["0", "two", "true", "2.5", "[2]"])
def test_devices_is_a_positive_integer_or_all(value):
    assert refusal([f"population.devices={value}"]).startswith("population.devices:")


def test_devices_default_to_one_and_round_trip(tmp_path):
    assert config_from_dict({}).population.devices == 1
    for value in ("all", 2):
        config = config_from_dict({"population": {"devices": value}})
        save_config(config, tmp_path / "config.yaml")
        assert load_config(tmp_path / "config.yaml").population.devices == value


def test_more_devices_than_the_machine_has_exit_2_before_anything_is_written(tmp_path, capsys):
    devices = 2 * jax.device_count()
    run_dir = tmp_path / "run"
    overrides = ["--set", f"population.devices={devices}", "--set", f"population.size={devices}"]
    assert cli.main(["train", "--out", str(run_dir), *overrides]) == 2
    error = capsys.readouterr().err
    assert f"population.devices: {devices} devices asked for, this machine has" in error
    assert f"set population.devices: {jax.device_count()} (or all)" in error
    assert not run_dir.exists()

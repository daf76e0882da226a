"""`fastpop doctor` on the CPU: what it reports of the device, versions and env families, the
update run, and the problems it names (an NVIDIA GPU JAX does not use, a family that fails)."""

from __future__ import annotations

import pytest

from fastpop.commands import cli, doctor
from fastpop.envs import MissingExtra, device_envs

GPU = "NVIDIA H100 80GB HBM3, 81559 MiB"


@pytest.fixture
def small(monkeypatch):
    """No GPU, a small agent for the update run, and two quick families plus a missing one."""
    monkeypatch.setattr(doctor, "nvidia_gpus", lambda: [])
    monkeypatch.setattr(doctor, "SMOKE_AGENT", {"hidden_sizes": (16, 16), "batch_size": 8})
    monkeypatch.setattr(
        doctor,
        "families",
        lambda: [
            doctor.Family("classic", "Pendulum-v1", "gymnasium", None),
            doctor.Family("gymnax", "gymnax/CartPole-v1", "gymnax", "gymnax"),
            doctor.Family("absent", "absent/Thing", "no_such_module_here", "absent"),
        ],
    )


def test_reports_device_versions_families_and_an_update_run(small, capsys):
    assert cli.main(["doctor", "--seconds", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "backend cpu" in out and "jaxlib" in out and "host" in out
    assert "CUDA: no CUDA plugin" in out and "NVIDIA GPUs on the machine: none found" in out
    assert "classic" in out and "ok (Pendulum-v1 built in" in out
    assert "ok (gymnax/CartPole-v1 built in" in out
    assert "not installed (no_such_module_here): pip install -e '.[absent]'" in out
    assert "TD3, 8 members vectorized on cpu" in out and "agent-updates/s" in out
    assert out.rstrip().endswith("no problems found")


def test_names_an_nvidia_gpu_that_jax_does_not_use_and_the_fix(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "nvidia_gpus", lambda: [GPU])
    monkeypatch.setattr(doctor, "families", list)
    monkeypatch.setattr(doctor, "report_update", lambda seconds: None)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"NVIDIA GPUs on the machine: {GPU}" in out
    assert (
        f"this machine has an NVIDIA GPU ({GPU}) but JAX runs on the CPU: no CUDA build of JAX "
        "is installed; install one: python -m pip install -e '.[cuda]'"
    ) in out
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert cli.main(["doctor"]) == 1
    assert "JAX_PLATFORMS=cpu keeps it off the GPU; unset it" in capsys.readouterr().out


def test_an_installed_family_that_fails_to_build_is_a_problem(small, monkeypatch, capsys):
    def without_six(env_id):  # what gymnax 0.0.9 did on a machine without `six`
        if env_id.startswith("gymnax/"):
            raise ModuleNotFoundError("No module named 'six'")

    monkeypatch.setattr(doctor, "build", without_six)
    monkeypatch.setattr(doctor, "report_update", lambda seconds: None)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAILED building gymnax/CartPole-v1: ModuleNotFoundError: No module named 'six'" in out
    assert "gymnax is installed but gymnax/CartPole-v1 fails" in out.split("problems:")[1]


def test_a_family_missing_another_package_is_not_installed_not_broken(small, monkeypatch, capsys):
    def without_imageio(env_id):  # `mujoco` alone, as brax and playground install it
        raise MissingExtra(f"environment {env_id!r} needs the 'imageio' package")

    monkeypatch.setattr(doctor, "build", without_imageio)
    monkeypatch.setattr(doctor, "report_update", lambda seconds: None)
    assert cli.main(["doctor"]) == 0
    assert "not installed: environment 'Pendulum-v1' needs the 'imageio'" in capsys.readouterr().out


def test_a_failed_update_run_is_a_problem(small, monkeypatch, capsys):
    def broken(seconds):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(doctor, "report_update", broken)
    monkeypatch.setattr(doctor, "families", list)
    assert cli.main(["doctor"]) == 1
    assert "the update run failed: RuntimeError: out of memory" in capsys.readouterr().out


@pytest.mark.parametrize("seconds", ["0", "-1", "nan"])
def test_seconds_must_be_positive(seconds, capsys):
    assert cli.main(["doctor", "--seconds", seconds]) == 2
    assert "--seconds must be a positive number of seconds" in capsys.readouterr().err


def test_every_device_family_is_checked_by_an_id_it_accepts():
    checked = {family.env_id for family in doctor.families()}
    for adapter in device_envs.families():
        assert adapter.PROBE_ID in checked
        assert adapter.check_id(adapter.PROBE_ID) == adapter.PROBE_ID

"""fastpop's XLA:CPU flags: given only to a jaxlib that knows them (XLA aborts the process at
start on a flag it does not know), a user's own setting kept."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from fastpop import xla_defaults

REGION, YNN = "xla_cpu_copy_insertion_use_region_analysis", "xla_cpu_experimental_ynn_fusion_type"


@pytest.mark.parametrize(
    "version, names",
    [((0, 10, 2), {REGION, YNN}), ((0, 9, 0), {REGION, YNN}), ((0, 8, 0), {REGION}),
     ((0, 4, 30), set()), ((), set())],
)  # fmt: skip
def test_each_flag_only_for_a_jaxlib_that_knows_it(version, names):
    assert set(xla_defaults.cpu_flags_for(version)) == names


def test_the_installed_jaxlib_is_read_without_importing_it():
    code = "import sys; from fastpop import xla_defaults as x; v = x.jaxlib_version(); "
    code += "print(len(v) == 3 and all(isinstance(p, int) for p in v), 'jaxlib' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["True", "False"], out.stderr


def test_an_older_jaxlib_gets_no_flag_it_lacks_and_a_users_flag_wins(monkeypatch):
    monkeypatch.setattr(xla_defaults, "jaxlib_version", lambda: (0, 8, 0))
    monkeypatch.setenv("XLA_FLAGS", f"--{REGION}=false")
    xla_defaults.apply_xla_defaults()
    assert os.environ["XLA_FLAGS"] == f"--{REGION}=false"  # the user's, and no YNN flag
    monkeypatch.setattr(xla_defaults, "jaxlib_version", lambda: (0, 10, 2))
    monkeypatch.setenv("XLA_FLAGS", "")
    xla_defaults.apply_xla_defaults()
    assert os.environ["XLA_FLAGS"] == f"--{REGION}=true --{YNN}="
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("FASTPOP_XLA_DEFAULTS", "0")
    xla_defaults.apply_xla_defaults()
    assert os.environ["XLA_FLAGS"] == ""


def test_env_stepping_programs_take_their_options_on_the_cpu_alone(monkeypatch):
    assert xla_defaults.env_stepping_options() == xla_defaults.ENV_STEPPING  # this CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert xla_defaults.env_stepping_options() == {}
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    monkeypatch.setattr(xla_defaults, "jaxlib_version", lambda: (0, 9, 0))
    assert xla_defaults.env_stepping_options() == {}

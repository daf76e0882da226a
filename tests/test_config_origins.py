"""A config error names where the bad value came from: a file that is not UTF-8 text names the
file; a bad value given with --set names the --set, also deep inside a mapping (a prior)."""

from __future__ import annotations

import os

import pytest

from fastpop import config as config_lib
from fastpop.commands import cli
from tests.runs import TD3_PENDULUM

PRIOR = "population.priors={actor_lr: {log_uniform: [1.0e-3, 1.0e-4]}}"


@pytest.mark.parametrize(
    "content,byte",
    [(b"seed: 1\nname: caf\xe9\n", "0xe9"), (b"\xff\xfes\x00e\x00e\x00d\x00", "0xff")],
    ids=["latin-1", "utf-16"],
)
def test_a_config_that_is_not_utf8_text_is_refused_naming_the_file(tmp_path, capsys, content, byte):
    path = tmp_path / "preset.yaml"
    path.write_bytes(content)
    assert cli.main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"fastpop: error: {path}: not a UTF-8 text file (byte {byte}")
    assert "codec" not in error and "Traceback" not in error
    assert sorted(os.listdir(tmp_path)) == ["preset.yaml"]


def test_a_bad_prior_given_with_set_names_the_set(tmp_path, capsys):
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.load_config(TD3_PENDULUM, [PRIOR])
    assert str(error.value).startswith("population.priors.actor_lr: ")
    assert str(error.value).endswith(f"(from --set {PRIOR})")
    assert str(TD3_PENDULUM) not in str(error.value)
    assert cli.main(["train", str(TD3_PENDULUM), "--set", PRIOR, "--out", str(tmp_path / "r")]) == 2
    assert f"(from --set {PRIOR})" in capsys.readouterr().err
    # A grid value too, and the same prior written in the file names the file.
    grid = "population.grid={policy_delay: [1, 0.5]}"
    with pytest.raises(config_lib.ConfigError, match=r"\(from --set population\.grid="):
        config_lib.load_config(TD3_PENDULUM, [grid])
    preset = tmp_path / "preset.yaml"
    preset.write_text("population:\n  priors:\n    actor_lr: {log_uniform: [1.0e-3, 1.0e-4]}\n")
    with pytest.raises(config_lib.ConfigError) as error:
        config_lib.load_config(preset)
    assert str(error.value).endswith(f"(in {preset})")

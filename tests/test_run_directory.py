"""`fastpop train --out DIR [--overwrite]`: what is refused and what is replaced. A user's
directory is never deleted; only a run fastpop wrote, and not a live one, is replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastpop.commands import cli, run_directory
from fastpop.config import ConfigError
from fastpop.run import loop, resume, startup
from tests.runs import TD3_PENDULUM


def write_run(path: Path) -> Path:
    """The files a stopped fastpop run leaves (contents do not matter to the checks)."""
    (path / "checkpoints" / "step_000000001024").mkdir(parents=True)
    (path / "checkpoints" / "step_000000001024" / "manifest.json").write_text("{}")
    for name in ("config.yaml", "metrics.jsonl", "members.json", "events.jsonl"):
        (path / name).write_text("x\n")
    (path / "events.out.tfevents.1700000000.host").write_bytes(b"\0")
    (path / "walltime_vs_return.png").write_bytes(b"\x89PNG")
    return path


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def train(out, *flags: str) -> int:
    return cli.main(["train", str(TD3_PENDULUM), "--out", str(out), *flags])


@pytest.fixture
def never_built(monkeypatch):
    """A refused directory is refused before the run is built."""

    def built(*args, **kwargs):
        raise AssertionError("the run was built")

    monkeypatch.setattr(loop.Run, "__init__", built)


def test_overwrite_refuses_a_directory_that_is_not_a_run(tmp_path, capsys, never_built):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "thesis.tex").write_text("years of work")
    for flags in (["--overwrite"], []):
        assert train(user, *flags) == 2
        err = capsys.readouterr().err
        assert f"run directory {user} already exists and is not a fastpop run" in err
        assert "holds config.yaml and metrics.jsonl or checkpoints/" in err
        assert "it holds thesis.tex" in err
        assert "fastpop resume" not in err  # it is no run to continue
        assert "--overwrite" not in err  # it would not help
    assert listing(user) == ["thesis.tex"]


def test_overwrite_refuses_the_working_directory(tmp_path, monkeypatch, capsys, never_built):
    write_run(tmp_path)
    before = listing(tmp_path)
    monkeypatch.chdir(tmp_path / "checkpoints")
    for out in (".", ".."):
        assert train(out, "--overwrite") == 2
        assert "is the working directory or holds it; nothing was deleted" in (
            capsys.readouterr().err
        )
    assert listing(tmp_path) == before


def test_overwrite_refuses_a_run_holding_a_file_fastpop_did_not_write(
    tmp_path, capsys, never_built
):
    run = write_run(tmp_path / "run")
    (run / "notes.txt").write_text("what I changed")
    before = listing(run)
    assert train(run, "--overwrite") == 2
    err = capsys.readouterr().err
    assert f"run directory {run} is a fastpop run but also holds notes.txt" in err
    assert "nothing was deleted" in err
    assert listing(run) == before


def test_without_overwrite_a_run_is_refused_with_how_to_continue_it(tmp_path, capsys, never_built):
    run = write_run(tmp_path / "run")
    assert train(run) == 2
    err = capsys.readouterr().err
    assert f"run directory {run} already exists" in err
    assert f"pass --overwrite, or continue it with `fastpop resume {run}`" in err
    file = tmp_path / "file"
    file.write_text("")
    assert train(file, "--overwrite") == 2
    assert f"run directory {file} is a file; choose another --out" in capsys.readouterr().err


def test_overwrite_refuses_a_live_run(tmp_path, capsys, never_built):
    run = write_run(tmp_path / "run")
    before = listing(run)
    held = resume.lock_run_directory(run)  # as the live run's process holds it
    try:
        assert train(run, "--overwrite") == 2
    finally:
        os.close(held)
    assert "is in use by another fastpop process" in capsys.readouterr().err
    assert listing(run) == before


def test_overwrite_empties_a_run_and_holds_it_while_training(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run")
    seen = []

    def execute(prepared, run_dir):
        seen.append(listing(run_dir))
        with pytest.raises(ConfigError, match="in use by another fastpop process"):
            resume.lock_run_directory(run_dir)
        return 0

    # no learner, no collectors: only what the command does with the directory
    monkeypatch.setattr(startup, "local_pieces", lambda *args, **kwargs: None)
    monkeypatch.setattr(loop.Run, "__init__", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(cli, "execute", execute)
    assert train(run, "--overwrite") == 0
    assert seen == [[]]
    os.close(resume.lock_run_directory(run))  # released after the run


def test_the_entries_fastpop_writes_include_a_distributed_runs_processes():
    from fastpop.distributed.multihost import PROCESSES_DIR

    assert PROCESSES_DIR in run_directory.RUN_ENTRIES

"""Command-line errors are clear and exit with code 2; the benchmark writes its tables."""

import json

import pytest

from fastpop.commands.cli import main


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--algo", "ppo"], "unknown algorithm 'ppo'; choose from td3, sac, dqn"),
        (
            ["--impl", "vectorized,parallel"],
            "unknown implementation 'parallel'; choose from vectorized, sequential, "
            "sequential-in-one-program, torch, torch-compile, torch-func, torch-leanrl, "
            "torch-leanrl-fp32, or vectorized+LEVER",
        ),
        (["--pop", "1,0"], "population size '0': must be >= 1"),
        (["--pop", "two"], "population size 'two': not an integer"),
        (["--batch-size", "0"], "batch size '0': must be >= 1"),
        (["--batch-size", "-32"], "batch size '-32': must be >= 1"),
        (["--anatomy-from", "0"], "population size '0': must be >= 1"),
    ],
)
def test_bad_bench_arguments_exit_2_with_a_clear_message(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "update", "--out", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written


def test_bench_update_passes_anatomy_from_on(tmp_path, monkeypatch):
    """`--anatomy-from P` reaches the benchmark's settings (what it reads: tests/test_anatomy.py
    and the bench-gpu smoke test)."""
    from fastpop.bench import update

    seen = []

    def fake_bench(settings, populations, implementations):
        seen.append(settings)
        raise SystemExit(0)

    monkeypatch.setattr(update, "bench_update", fake_bench)
    with pytest.raises(SystemExit):
        main(["bench", "update", "--pop", "4", "--anatomy-from", "3", "--out", str(tmp_path)])
    assert seen[0].anatomy_from == 3


def test_bench_update_writes_json_and_png(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FASTPOP_MEMBERS_PER_CHUNK", "2")  # not measured: the CLI is tested here
    code = main(
        [
            "bench",
            "update",
            "--algo",
            "td3",
            "--pop",
            "2",
            "--impl",
            "vectorized,sequential",
            "--batch-size",
            "16",
            "--updates-per-call",
            "2",
            "--min-seconds",
            "0",
            "--anatomy-from",  # (the anatomy is tested in tests/test_update_levers.py)
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads((tmp_path / "update_td3_cpu.json").read_text())
    assert not any("kernels_per_update_step" in row for row in result["rows"])
    assert (tmp_path / "update_td3_cpu.png").stat().st_size > 0
    rows = {(row["impl"], row["population"]): row for row in result["rows"]}
    assert set(rows) == {(impl, size) for impl in ("vectorized", "sequential") for size in (2,)}
    assert result["shapes"]["batch_size"] == 16
    assert result["flops_per_update"] > 0 and result["matmul_gflops_per_s"] > 0
    for (_, size), row in rows.items():
        assert row["agent_updates_per_s"] > 0
        assert row["speedup_over_sequential"] == pytest.approx(
            row["agent_updates_per_s"] / rows[("sequential", size)]["agent_updates_per_s"]
        )
    assert "agent-updates/s" in capsys.readouterr().out


def test_the_help_says_what_train_does_in_both_collection_modes(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per command
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    (line,) = [
        line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["train"]
    ]
    assert "collector processes (gymnasium ids)" in line
    assert "on the accelerator with the updates (brax, gymnax, playground ids)" in line
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "stepped in collector processes next to the learner (collect.mode: processes)" in text
    assert "no worker processes (collect.mode: device)" in text


def test_only_fastpop_s_own_errors_are_bad_input(tmp_path, monkeypatch, capsys):
    """A factory's ValueError (a refused config) is exit 2 naming it; a ValueError from deeper
    down (JAX, a bug) is not passed off as the user's mistake: it propagates."""
    from fastpop import strategies
    from fastpop.run import loop
    from tests.runs import TD3_PENDULUM

    def refuse(name, setting):
        raise ValueError("this strategy refuses the population")

    monkeypatch.setattr(strategies, "make_strategy", refuse)
    out = tmp_path / "refused"
    assert main(["train", str(TD3_PENDULUM), "--out", str(out)]) == 2
    assert "this strategy refuses the population" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.undo()

    def internal(*args, **kwargs):
        raise ValueError("an internal array mismatch")

    monkeypatch.setattr(loop.Run, "__init__", internal)
    with pytest.raises(ValueError, match="an internal array mismatch"):
        main(["train", str(TD3_PENDULUM), "--out", str(tmp_path / "internal")])

import json
import math
import re
import sys
import warnings

import pytest

from fastpop.analysis import plot
from fastpop.analysis.plot import (
    STEPS_PLOT,
    WALLTIME_PLOT,
    load_curve,
    plot_runs,
    returns_by_minute,
    returns_table,
)
from fastpop.run import metrics, run_files
from fastpop.run.metrics import MetricsWriter
from fastpop.run.run_files import evaluation_rounds, read_metrics, summarize
from tests.dependencies import require

MEMBERS = 3
EVALUATIONS = 4


def round_rows(evaluation: int, members: int = MEMBERS, best: int = 1) -> list[dict]:
    """One evaluation round; member `best` leads, returns grow with evaluation."""
    return [
        {
            "wall_time": 30.0 * (evaluation + 1),
            "env_steps": 1000 * members * (evaluation + 1),
            "member_env_steps": 1000 * (evaluation + 1),
            "updates": 500 * (evaluation + 1),
            "member": member,
            "return_mean": 100.0 * evaluation + (50.0 if member == best else 10.0 * member),
            "return_std": 5.0,
            "episodes": 10,
            "hparams": {"actor_lr": 3e-4 * (member + 1), "policy_delay": 2},
            "critic_loss": 0.5,
        }
        for member in range(members)
    ]


def write_rows(run_dir, rows: list[dict]) -> None:
    """metrics.jsonl as a run writes it (one round per eval_index), without MetricsWriter."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"eval_index": int(row["wall_time"] // 30) - 1, **row}) for row in rows]
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def write_run(run_dir, evaluations=EVALUATIONS, best=1, tensorboard=False) -> list[dict]:
    written = []
    with MetricsWriter(run_dir, tensorboard=tensorboard) as writer:
        for evaluation in range(evaluations):
            rows = round_rows(evaluation, best=best)
            writer.log_evaluation(rows)
            written += [{"eval_index": evaluation, **row} for row in rows]
    return written


def test_rows_round_trip(tmp_path):
    written = write_run(tmp_path / "run")
    assert read_metrics(tmp_path / "run" / "metrics.jsonl") == written
    assert read_metrics(tmp_path / "run") == written
    rounds = evaluation_rounds(written)
    assert [len(r) for r in rounds] == [MEMBERS] * EVALUATIONS
    assert [r[0]["eval_index"] for r in rounds] == list(range(EVALUATIONS))


def test_nan_round_trips_as_null(tmp_path):
    rows = round_rows(0)
    rows[0]["return_mean"] = math.nan
    rows[0]["return_std"] = float("nan")
    rows[1]["hparams"]["actor_lr"] = math.inf
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.log_evaluation(rows)
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["return_mean"] is None and first["return_std"] is None
    back = read_metrics(tmp_path / "metrics.jsonl")
    assert math.isnan(back[0]["return_mean"]) and math.isnan(back[0]["return_std"])
    assert math.isnan(back[1]["hparams"]["actor_lr"])
    assert back[2]["return_mean"] == rows[2]["return_mean"]


def test_truncated_last_line_is_ignored_and_resume_appends(tmp_path):
    written = write_run(tmp_path, evaluations=2)
    path = tmp_path / "metrics.jsonl"
    with path.open("a") as f:
        f.write('{"wall_time": 91.0, "env_steps": 90')  # a crash mid-write
    assert read_metrics(path) == written
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.log_evaluation(round_rows(2))
    rows = read_metrics(path)
    assert len(rows) == 3 * MEMBERS
    assert {r["eval_index"] for r in rows[-MEMBERS:]} == {2}


def test_corrupt_middle_line_names_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl:2"):
        read_metrics(path)


def test_missing_field_is_rejected(tmp_path):
    row = round_rows(0)[0]
    del row["episodes"]
    with (
        MetricsWriter(tmp_path, tensorboard=False) as writer,
        pytest.raises(ValueError, match="episodes"),
    ):
        writer.log_evaluation([row])


def test_summarize_picks_best_member(tmp_path):
    rows = write_run(tmp_path, best=2)
    summary = summarize(rows)
    assert summary["best_member"] == 2
    assert summary["best_return"] == 100.0 * (EVALUATIONS - 1) + 50.0
    assert summary["median_return"] == 100.0 * (EVALUATIONS - 1) + 10.0
    assert summary["member_returns"] == {0: 300.0, 1: 310.0, 2: 350.0}
    assert summary["env_steps"] == 1000 * MEMBERS * EVALUATIONS
    assert summary["wall_time"] == 30.0 * EVALUATIONS
    assert summary["evaluations"] == EVALUATIONS
    assert [entry["member"] for entry in summary["ranking"]] == [2, 1, 0]
    assert summary["ranking"][0] == {
        "member": 2,
        "final_return": 350.0,
        "best_return": 350.0,
        "hparams": {"actor_lr": 3e-4 * 3, "policy_delay": 2},
    }


def test_returns_by_minute_reads_the_latest_round_taken_by_then(tmp_path):
    rows = [row for e in range(4) for row in round_rows(e)]  # rounds at 0.5, 1, 1.5, 2 minutes
    rows[4]["return_mean"] = 1000.0  # round 1 (1 minute) has an outlier best
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        for index in range(4):
            writer.log_evaluation(rows[index * MEMBERS : (index + 1) * MEMBERS])
    curve = load_curve(tmp_path)
    assert returns_by_minute(curve, 0.25) == (pytest.approx(math.nan, nan_ok=True),) * 2
    assert returns_by_minute(curve, 1.2) == (1000.0, 1000.0)
    assert returns_by_minute(curve, 5) == (350.0, 1000.0)
    table = returns_table([tmp_path], minutes=(1.2, 2, 5)).splitlines()
    assert table[0] == "| run | 1.2 min | 2 min | 5 min |"
    # 5 minutes is past the run's end (its last evaluation, at 2 minutes, without a summary)
    assert table[2].endswith("| 1000 (1000) | 350 (1000) | ran 2.0 min |")
    # Without minutes: quarters of the run's 2 minutes, each with a value (5, 10, 20 showed none)
    table = returns_table([tmp_path]).splitlines()
    assert table[0] == "| run | 0.5 min | 1 min | 1.5 min | 2 min |"
    assert table[2].endswith("| 50 (50) | 1000 (1000) | 250 (1000) | 350 (1000) |"), table


def test_default_minutes_lie_inside_the_longest_run():
    assert plot.default_minutes([2.0, 0.5]) == (0.5, 1.0, 1.5, 2.0)
    assert plot.default_minutes([0.8237]) == (0.2, 0.41, 0.61, 0.82)
    assert plot.default_minutes([47.0, math.inf]) == (11.0, 23.0, 35.0, 47.0)
    assert plot.default_minutes([]) == (0.0,)


def test_cemrl_runs_get_a_cem_mean_curve(tmp_path):
    write_run(tmp_path / "independent")
    write_run(tmp_path / "cemrl")
    (tmp_path / "cemrl" / "config.yaml").write_text("strategy: cemrl\n")
    assert load_curve(tmp_path / "independent").mean_member_return == ()
    curve = load_curve(tmp_path / "cemrl")
    assert curve.mean_member_return == tuple(100.0 * e for e in range(EVALUATIONS))  # member 0
    assert "cemrl" in curve.label
    assert all(p.exists() for p in plot_runs([tmp_path / "cemrl", tmp_path / "independent"]))


def test_summarize_groups_by_env_steps_without_eval_index():
    rows = [row for e in range(EVALUATIONS) for row in round_rows(e, best=0)]
    assert len(evaluation_rounds(rows)) == EVALUATIONS
    assert summarize(rows)["best_member"] == 0


def test_events_and_scalars_files(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.log_event("collector_restart", {"collector": 1, "reason": "exit code -9"})
        writer.log_scalars(10, {"learner/critic_loss": 0.25})
        with pytest.raises(ValueError, match="kind"):
            writer.log_event("exploit", {"kind": "x"})
    events = run_files.read_jsonl(tmp_path / "events.jsonl")
    assert events[0]["kind"] == "collector_restart" and events[0]["collector"] == 1
    scalars = run_files.read_jsonl(tmp_path / "scalars.jsonl")
    assert scalars == [{"step": 10, "learner/critic_loss": 0.25}]


def test_learner_metrics_are_averaged_on_the_host_leaving_out_nan():
    import jax.numpy as jnp
    import numpy as np

    from fastpop.learn.learner import averaged_metrics

    metrics = {"critic_loss": jnp.array([1.0, jnp.nan, 2.0]), "actor_loss": jnp.full(2, jnp.nan)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        averaged = averaged_metrics(metrics)
    assert averaged["learner/critic_loss"] == 1.5
    assert math.isnan(averaged["learner/actor_loss"])
    first_member = lambda leaf: np.asarray(leaf)[:1]
    assert averaged_metrics(metrics, first_member)["learner/critic_loss"] == 1.0


def test_tensorboard_event_file(tmp_path):
    require("tensorboardX")
    with MetricsWriter(tmp_path, tensorboard=True) as writer:
        writer.log_evaluation(round_rows(0))
        writer.log_scalars(1, {"learner/critic_loss": 0.5})
    event_files = list(tmp_path.glob("events.out.tfevents.*"))
    assert event_files and event_files[0].stat().st_size > 0


@pytest.fixture
def tensorboardx_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # makes it unimportable
    metrics._tensorboard_installed.cache_clear()
    yield
    metrics._tensorboard_installed.cache_clear()


def test_missing_tensorboardx_warns_once(tmp_path, tensorboardx_missing):
    with pytest.warns(UserWarning, match="tensorboardX"):
        MetricsWriter(tmp_path / "a").close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with MetricsWriter(tmp_path / "b") as writer:
            writer.log_evaluation(round_rows(0))
    assert not list((tmp_path / "b").glob("events.out.tfevents.*"))


def test_the_tensorboard_writer_is_opened_by_the_first_write(tmp_path):
    require("tensorboardX")
    with MetricsWriter(tmp_path / "quiet"):
        pass
    assert not list((tmp_path / "quiet").glob("events.out.tfevents.*"))
    with MetricsWriter(tmp_path / "written") as writer:
        assert not list((tmp_path / "written").glob("events.out.tfevents.*"))
        writer.log_scalars(1, {"learner/critic_loss": 0.5})
        assert list((tmp_path / "written").glob("events.out.tfevents.*"))


def test_plot_two_runs(tmp_path):
    runs = [tmp_path / "runs" / "vectorized", tmp_path / "runs" / "sequential"]
    write_run(runs[0])
    write_run(runs[1], evaluations=2, best=0)
    (runs[0] / "config.yaml").write_text("algorithm: td3\nenv:\n  id: HalfCheetah-v5\n")
    paths = plot_runs(runs, out_dir=tmp_path / "plots")
    assert [p.name for p in paths] == [WALLTIME_PLOT, STEPS_PLOT]
    for path in paths:
        assert path.parent == tmp_path / "plots" and path.stat().st_size > 0
    default = plot_runs(runs)
    assert default[0].parent == (tmp_path / "runs" / "comparison_vectorized_sequential").resolve()
    assert plot_runs(runs[:1])[0].parent == runs[0]


def test_plot_missing_or_empty_metrics_names_path(tmp_path):
    write_run(tmp_path / "good")
    (tmp_path / "missing").mkdir()
    with pytest.raises(ValueError, match=re.escape(str(tmp_path / "missing"))):
        plot_runs([tmp_path / "good", tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="no evaluation rows"):
        plot_runs([tmp_path / "empty"])


def test_table_marks_minutes_past_a_runs_end(tmp_path):
    """Two 15-minute runs: their 20-minute cells say how long they ran instead of passing
    their final values off as 20-minute results; a run still going shows what it has."""
    runs = [tmp_path / "a", tmp_path / "b", tmp_path / "live"]
    for run, best in zip(runs, (1, 0, 2), strict=True):
        rows = [row for e in range(30) for row in round_rows(e, best=best)]  # every 30 s
        write_rows(run, [r for r in rows if r["wall_time"] <= 15 * 60])
    for run in runs[:2]:  # finished: summary.json holds the whole run's wall time
        (run / "summary.json").write_text(json.dumps({"wall_time": 15 * 60 + 2.5}))
    table = returns_table(runs, minutes=(10, 15, 20)).splitlines()
    assert table[2] == "| a | 1950 (1950) | 2950 (2950) | ran 15.0 min |"
    assert table[3] == "| b | 1950 (1950) | 2950 (2950) | ran 15.0 min |"
    assert table[4].endswith("| ran 15.0 min |")
    assert load_curve(runs[0]).ran_minutes == pytest.approx(15 + 2.5 / 60)
    assert load_curve(runs[2]).ran_minutes == pytest.approx(15.0)  # its last evaluation
    longer = returns_table(runs[:1], minutes=(15.02,)).splitlines()
    assert longer[2].endswith("| 2950 (2950) |")  # inside the run's end, past its evaluation


def test_a_directory_without_evaluation_rows_is_named_by_the_plot_and_the_sweep(tmp_path):
    from fastpop.analysis.sweep import load_member_curves

    for load, cannot in ((plot.load_curve, "plot"), (load_member_curves, "aggregate")):
        with pytest.raises(ValueError, match=r"no metrics file; is .* a fastpop run directory"):
            load(tmp_path)
        (tmp_path / run_files.METRICS_FILE).write_text("")
        with pytest.raises(ValueError, match=f"no evaluation rows yet; nothing to {cannot}"):
            load(tmp_path)
        (tmp_path / run_files.METRICS_FILE).unlink()

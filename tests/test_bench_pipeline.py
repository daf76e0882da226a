"""`fastpop bench pipeline`'s learner utilisation (issue 58): measured in the run's learning
window (its first update to its loop's end), evaluations and checkpoints taken out of it and
reported apart, the stop's checkpoint and final evaluation after it; bound by its rows when the
learner waited for them for more than 10% of that window; and its rate against the update
benchmark at the run's own K, batch size and replay rows. Pure functions over a made-up
summary: the smoke run of `fastpop bench gpu` (tests/test_bench_gpu.py) runs the real one."""

from __future__ import annotations

import pytest

from fastpop import config as config_lib
from fastpop.bench import pipeline
from fastpop.run.progress import TIMERS, ClockReading, LearningWindow

BASE = {
    "name": "bench_pipeline",
    "algo": "td3",
    "env": {"id": "Pendulum-v1"},
    "population": {"size": 8},
    "agent": {"hidden_sizes": [16, 16], "batch_size": 64},
    "log": {"tensorboard": False},
}


def training(**sections) -> config_lib.Config:
    """`training_config`'s run of BASE, with `sections`' fields changed."""
    config = config_lib.config_to_dict(
        pipeline.training_config(BASE, seconds=30.0, collectors=4, warmup=500)
    )
    return config_lib.config_from_dict(
        config | {name: config[name] | fields for name, fields in sections.items()}
    )


def summary_of(window_seconds: dict, started: float = 10.0, ended: float = 40.0) -> dict:
    """A run's summary whose learning window ran from `started` to `ended` (loop seconds: the
    rest of the span), with 600 updates per member in it; its wall time 5 s past the window
    (the final evaluation, the stop's checkpoint)."""
    seconds = dict.fromkeys(TIMERS, 0.0) | window_seconds
    seconds["loop"] = ended - started - sum(seconds.values())
    window = {"started_at": started, "ended_at": ended, "seconds": seconds}
    return {
        "wall_time": ended + 5.0,
        "learning_window": window | {"updates_per_member": 600},
        "learner_seconds": seconds | {"checkpoints": 4.5, "final_evaluation": 0.5},
        "workers": {},
        "samples_per_insert_target": 256.0,
        "samples_per_insert_achieved": 250.0,
    }


def test_the_window_leaves_out_evaluations_and_checkpoints_and_what_follows_the_loop():
    summary = summary_of(
        {
            "update_dispatch": 3.0,
            "update_wait": 15.0,
            "idle": 1.0,
            "evaluation_snapshots": 2.0,
            "evaluation_results": 0.5,
            "strategies": 0.5,
            "checkpoints": 2.0,
        }
    )
    learner = pipeline.utilisation_from_summary(summary, training(), update_rate=200.0)
    assert learner["learning_seconds"] == 30.0
    assert learner["evaluation_seconds"] == 3.0 and learner["checkpoint_seconds"] == 2.0
    assert learner["evaluation_fraction_of_learning"] == pytest.approx(0.1)
    assert learner["checkpoint_fraction_of_learning"] == pytest.approx(2 / 30)
    assert learner["window_seconds"] == 25.0  # 30 s less 3 s of evaluations and 2 of checkpoints
    assert learner["after_window_seconds"] == 5.0  # not in it (the old figure counted it)
    assert learner["busy_seconds"] == 18.0
    assert learner["busy_fraction_of_window"] == pytest.approx(18 / 25)
    assert learner["waiting_for_rows_fraction"] == pytest.approx(1 / 25)
    assert learner["bound_by"] == "update"
    # 600 updates x 8 members in the window's 25 s
    assert learner["run_agent_updates_per_s"] == pytest.approx(192.0)
    assert learner["rate_vs_benchmark"] == pytest.approx(0.96)
    assert learner["collectors"] == 4 and learner["train_seconds"] == 45.0


def test_the_poll_for_evaluation_results_stays_in_a_window_that_took_no_snapshot():
    """The loop polls for results on every pass (timed as `evaluation_results`): with no round
    taken in the window, that is the loop's own time, not an evaluation's."""
    summary = summary_of({"update_dispatch": 2.0, "update_wait": 8.0, "evaluation_results": 0.5})
    learner = pipeline.utilisation_from_summary(summary, training(), update_rate=200.0)
    assert learner["evaluation_seconds"] == 0.0 and learner["window_seconds"] == 30.0
    assert learner["busy_fraction_of_window"] == pytest.approx(10 / 30)


@pytest.mark.parametrize(
    ("idle", "update_rate", "bound_by"),
    [
        (2.0, 1000.0, "update"),
        # idle over a tenth of its window, its rate (600 x 8 in 20 s) 0.24x the benchmark's
        (2.1, 1000.0, "rows"),
        (15.0, 1000.0, "rows"),
        (15.0, 280.0, "update"),  # idle as long, its rate 0.86x: the wait cost no updates
    ],
)
def test_a_run_waiting_for_rows_more_than_a_tenth_of_its_window_below_its_rate_is_bound_by_rows(
    idle, update_rate, bound_by
):
    summary = summary_of({"update_dispatch": 1.0, "update_wait": 5.0, "idle": idle}, 0.0, 20.0)
    learner = pipeline.utilisation_from_summary(summary, training(), update_rate=update_rate)
    assert learner["waiting_for_rows_seconds"] == idle
    assert learner["waiting_for_rows_fraction"] == pytest.approx(idle / 20.0)
    assert learner["bound_by"] == bound_by
    assert learner["rows_bound_above"] == pipeline.ROWS_BOUND_FRACTION == 0.10


def test_the_benchmark_is_set_like_the_run():
    """K, batch size and rows per member are the run's, not `bench update`'s defaults (K=10,
    10,000 rows), and follow the run's config."""
    config = training()
    settings = pipeline.benchmark_settings(config, seconds=2.0)
    assert settings.updates_per_call == config.train.updates_per_call == 50
    assert settings.batch_size == config.agent["batch_size"] == 64
    assert settings.replay_rows == config.replay.capacity == 100_000
    assert settings.algo == "td3" and settings.agent == config.agent
    assert settings.anatomy_from > config.population.size  # the rate only: no anatomy
    other = training(train={"updates_per_call": 7}, replay={"capacity": 20_000})
    settings = pipeline.benchmark_settings(other, seconds=2.0)
    assert (settings.updates_per_call, settings.replay_rows) == (7, 20_000)


def test_the_training_run_measures_no_evaluation_or_checkpoint_before_its_stop():
    config = training()
    assert config.eval.interval >= config.train.total_env_steps
    assert (
        config.checkpoint.interval_seconds is None and config.checkpoint.interval_env_steps is None
    )
    assert config.checkpoint.replay is False  # the stop's checkpoint: not measured, kept short
    assert (config.collect.num_collectors, config.replay.min_size) == (4, 500)
    assert config.train.max_wall_seconds == 30.0
    # ended by its env steps where given (the smoke's: it must update on a loaded CPU)
    by_steps = pipeline.training_config(BASE, seconds=60.0, collectors=1, warmup=256, env_steps=512)
    assert by_steps.train.total_env_steps == 512 and by_steps.train.max_wall_seconds == 60.0
    assert config.train.total_env_steps == 10_000_000  # else the wall time ends it


def test_the_learning_window_is_the_timers_between_its_two_readings():
    start = ClockReading(5.0, dict.fromkeys(TIMERS, 1.0), updates=0)
    end = ClockReading(9.0, dict.fromkeys(TIMERS, 1.5) | {"idle": 3.0}, updates=40)
    window = LearningWindow(start, end).summary()
    assert (window["started_at"], window["ended_at"]) == (5.0, 9.0)
    assert window["seconds"]["idle"] == 2.0 and window["seconds"]["checkpoints"] == 0.5
    assert window["updates_per_member"] == 40
    assert LearningWindow(None, end).summary() is None  # no update in this process

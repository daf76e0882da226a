"""Process mode keeps one update in flight while the host publishes the policies of the update
before it (fastpop.run.update_pipeline): what the collectors receive after update n are exactly
the member policies of n's resulting states (not n+1's, and never an array the next update was
handed and donated), every update's in order; and the run's time breakdown accounts for its
whole wall time."""

from __future__ import annotations

import time

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.population import replay
from fastpop.run import loop
from fastpop.run.parts import build_learner, build_run
from fastpop.run.phases import PhaseClock, PhaseWatch
from fastpop.run.progress import TIMERS
from fastpop.run.update_pipeline import UpdatePipeline
from tests.runs import FAST, SMALL, TD3_PENDULUM

CHUNKS = 4


def rows_for(config, spec, chunk: int) -> replay.Rows:
    rng = np.random.default_rng(chunk)
    lanes = config.population.size * config.collect.envs_per_member
    obs, action, reward, *flags = replay.row_layout(spec, (lanes, config.collect.chunk_len))
    return replay.Rows(
        rng.normal(size=obs.shape).astype(obs.dtype),
        rng.uniform(-1, 1, action.shape).astype(action.dtype),
        rng.normal(size=reward.shape).astype(reward.dtype),
        *(rng.random(flag.shape) < 0.05 for flag in flags),
    )


class RecordingCollection:
    """Workers that act with copies of the policies: what each publish sent, and when."""

    def __init__(self, learner):
        self.learner, self.version, self.sent = learner, learner.policy_version, []

    def publishes_to(self, version: int) -> bool:
        return version != self.version

    def publish(self, learner, copy) -> None:
        policy, hparams, clocks = learner.host_policy_tree(copy)
        host = lambda tree: jax.tree.map(np.array, tree)
        self.sent.append((copy.version, learner.policy_version, host((policy, hparams, clocks))))
        self.version = copy.version


def recording_updates(learner) -> dict[int, list[np.ndarray]]:
    """Per update call (1, 2, ...), the host copy of the policies of the states it returned,
    read as it returns them (before any later call is dispatched)."""
    made, training = {}, learner.training

    def update(*args):
        states, metrics = training.update(*args)
        made[len(made) + 1] = [np.array(x) for x in jax.tree.leaves(training.policies(states))]
        return states, metrics

    learner.training = training._replace(update=update)
    return made


CASES = {
    "td3": [],  # the executor's policies: a compiled program's output
    # the policies are the states' own actors, and the update donates them
    "td3-cemrl": ["strategy=cemrl", "population.size=5", "replay.shared=true"],
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_the_policies_published_after_update_n_are_those_of_its_resulting_states(overrides):
    config = config_lib.load_config(None, [*SMALL, *overrides])
    learner = build_learner(config)
    made = recording_updates(learner)
    collection = RecordingCollection(learner)
    timers = {}
    pipeline = UpdatePipeline(
        learner, collection, PhaseClock(lambda: timers), PhaseWatch(print, 60.0), lambda: None
    )
    donated = []
    for chunk in range(CHUNKS):
        learner.insert(rows_for(config, learner.replay.spec, chunk))
        while learner.can_update():
            states_in = jax.tree.leaves(learner.states)
            pipeline.start()
            donated.append(all(leaf.is_deleted() for leaf in states_in))
    while not pipeline.publish_if_done():  # the last update's, once it is done: no wait
        time.sleep(0.001)
    assert not pipeline.publish_if_done()  # sent already
    pipeline.finish()  # nothing left to send

    calls = len(made)
    assert calls >= 3 and all(donated)  # every call was handed its states and donated them
    assert [version for version, _, _ in collection.sent] == list(range(1, calls + 1))
    for version, dispatched, (policy, hparams, clocks) in collection.sent:
        if version < calls:  # sent while the next update was in flight
            assert dispatched == version + 1
        sent = jax.tree.leaves(policy)
        for got, want in zip(sent, made[version], strict=True):
            np.testing.assert_array_equal(got, want)
        if version < calls:  # an update changes the policies: n's are told from n+1's
            pairs = zip(sent, made[version + 1], strict=True)
            assert any(not np.array_equal(a, b) for a, b in pairs)
        stacked = zip(jax.tree.leaves(hparams), jax.tree.leaves(learner.hparams), strict=True)
        for got, want in stacked:
            np.testing.assert_array_equal(got, np.asarray(want))
        np.testing.assert_array_equal(clocks[0], learner.clocks.epochs)
    assert timers["update_dispatch"] > 0 and timers["publish_write"] > 0


def test_the_time_breakdown_accounts_for_the_whole_wall_time(tmp_path):
    """A short process-mode run: every phase of the loop timed, each second once, the loop's
    own Python between them as `loop`, and `other` (what no phase covered: the run's setup
    before its workers start) next to nothing: the parts sum to the run's wall time."""
    overrides = [*FAST, "train.total_env_steps=512", "eval.interval=256"]
    config = config_lib.load_config(TD3_PENDULUM, [*overrides, "log.tensorboard=false"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lines: list[str] = []
    summary = loop.Run(build_run(config), run_dir, log=lines.append).run()
    seconds, wall = summary["learner_seconds"], summary["wall_time"]
    assert set(seconds) == {*TIMERS, "other"}
    assert all(value >= 0 for value in seconds.values()), seconds
    assert sum(seconds.values()) == pytest.approx(wall, abs=0.01), (seconds, wall)
    assert seconds["other"] < 0.01 * wall, seconds
    for phase in ("starting", "transport", "update_dispatch", "publish_write", "loop", "stopping"):
        assert seconds[phase] > 0, (phase, seconds)
    assert seconds["final_evaluation"] + seconds["evaluation_results"] > 0, seconds
    # The learning window: from the first update dispatched to the loop's end, each second once; the
    # final evaluation, the stop's checkpoint and the workers' stop after it (bench pipeline's
    # learner utilisation is measured in it)
    window = summary["learning_window"]
    assert window["started_at"] == summary["learning_started_at"] < window["ended_at"] < wall
    span = window["ended_at"] - window["started_at"]
    assert sum(window["seconds"].values()) == pytest.approx(span, abs=0.01), window
    for phase in ("starting", "final_evaluation", "stopping", "checkpoints"):
        assert window["seconds"][phase] == 0, (phase, window)
    assert seconds["checkpoints"] > 0  # the stop's
    assert window["seconds"]["update_dispatch"] > 0
    # the window opens once the first update is dispatched (its compile before it): that
    # call's updates are not counted in it
    first_call = config.train.updates_per_call
    assert window["updates_per_member"] == summary["updates_per_member"] - first_call > 0
    breakdown = next(line for line in lines if line.startswith("time breakdown")).splitlines()
    assert any(line.startswith("  learner other ") for line in breakdown), breakdown

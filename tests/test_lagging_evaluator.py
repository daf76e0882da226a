"""Strategies whose evaluations come back late (process mode's evaluator is slower than
eval.interval, and halving and `pbt.wait: false` never wait for it) credit each result to the
policy and hparams that produced it: device-mode runs on gymnax's Pendulum (programs compile in
about a second) whose evaluator is held back two snapshots, checked against their own metrics
rows and lineage. Also each trial's exploration clocks: a fresh halving trial's warm-up and
epsilon count its own steps."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.run import loop
from fastpop.run.parts import build_run
from fastpop.run.startup import local_pieces
from fastpop.strategies.pb2 import to_unit
from fastpop.strategies.priors import parse_prior
from tests.dependencies import require
from tests.helpers import metric_rows
from tests.test_device_mode import DQN_PRESET, PRESET, SHORT

require("gymnax")

LAG = 2  # snapshots a result is held back: a lag longer than eval.interval
SWEEP = [
    *SHORT,
    "population.size=4",
    "eval.interval=128",
    "eval.episodes=1",
    "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-2]}, "
    "exploration_noise: {uniform: [0.0, 0.5]}}",
]


class HeldBack:
    """A collection whose evaluation results come back `lag` snapshots after they were taken
    (all of them once the run waits for its last ones): device mode's, delegated to."""

    def __init__(self, collection, lag: int):
        self.collection, self.lag = collection, lag
        self.handed, self.held = 0, []

    def __getattr__(self, name):
        return getattr(self.collection, name)

    def evaluate(self, arrays: dict) -> None:
        self.handed += 1
        self.collection.evaluate(arrays)

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        self.held += self.collection.evaluations(0.0)
        due = [r for r in self.held if timeout or r["eval_index"] < self.handed - self.lag]
        self.held = [r for r in self.held if r not in due]
        return due


def lagging_run(tmp_path: Path, name: str, *overrides: str, preset: Path = PRESET, lag=LAG):
    config = config_lib.load_config(preset, [*SWEEP, *overrides])
    run_dir = tmp_path / name
    run_dir.mkdir()
    parts = build_run(config)
    pieces = local_pieces(parts, run_dir / loop.CHECKPOINTS_DIR, lambda message: None)
    pieces = pieces._replace(collection=HeldBack(pieces.collection, lag))
    run = loop.Run(parts, run_dir, log=lambda message: None, pieces=pieces)
    run.run()
    return run


def lineage(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "lineage.jsonl").read_text().splitlines()]


def test_halving_judges_each_trial_at_the_steps_it_trained_and_on_its_own_snapshots(tmp_path):
    run = lagging_run(
        tmp_path, "halving", "strategy=halving", "halving.first_rung=128",
        "halving.reduction_factor=2", "train.total_env_steps=1536",
    )  # fmt: skip
    size, rows = 4, metric_rows(run.run_dir)
    trial_at = {(r["eval_index"], r["member"]): r["trial"] for r in rows}
    snapshot_steps = {r["eval_index"]: r["member_env_steps"] for r in rows}
    started = dict.fromkeys(range(size), 0)  # trial -> member env steps when its state began
    stops = [e for e in lineage(run.run_dir) if e["kind"] == "trial"]
    for event in stops:
        started[event["trial"]] = event["env_steps"] // size
    late = [e for e in stops if started[e["stopped_trial"]] > 0]
    assert len(late) >= 3  # fresh trials reached rungs, judged under a lag of two snapshots
    trained = {}  # stop -> the env steps of the stopped trial's own rows at its snapshot
    for event in stops:
        trial, index = event["stopped_trial"], event["eval_index"]
        assert trial_at[index, event["target"]] == trial  # its own policy was evaluated
        trained[trial] = snapshot_steps[index] - started[trial]
        assert trained[trial] >= event["rung_age"]
    assert [e["trial_steps"] for e in stops] == [trained[e["stopped_trial"]] for e in stops]


def test_pb2_observes_each_change_with_the_evaluated_hparams_of_one_line(tmp_path):
    run = lagging_run(
        tmp_path, "pb2", "strategy=pb2", "pbt.interval=128", "pb2.window=100",
        "train.total_env_steps=2048",
    )  # fmt: skip
    rows = metric_rows(run.run_dir)
    at = {(r["eval_index"], r["member"]): r for r in rows}
    steps = {r["eval_index"]: r["member_env_steps"] for r in rows}
    priors = {n: parse_prior(n, spec) for n, spec in run.config.population.priors.items()}
    unit = lambda h: tuple(to_unit(priors[n], h[n]) for n in sorted(priors))
    changes = lineage(run.run_dir)
    assert changes and run.learner.updates  # rounds were decided, while the members trained

    def one_line(member: int, index: int) -> bool:
        """No round changed the member between snapshots index - 1 and index."""
        return not any(
            e["target"] == member and steps[index - 1] <= e["env_steps"] // 4 < steps[index]
            for e in changes
        )

    expected = {
        (index, at[index, m]["return_mean"] - at[index - 1, m]["return_mean"],
         unit(at[index, m]["hparams"]))
        for index in range(1, max(steps) + 1) if index - 1 in steps and index in steps
        for m in range(4) if one_line(m, index)
    }  # fmt: skip
    observed = {(int(o[0]), o[1], tuple(o[2:])) for o in run.learner.strategy_state.explorer[0]}
    stepped = max(e["eval_index"] for e in changes)  # later results came after training
    assert observed == {o for o in expected if o[0] <= stepped}
    assert len(observed) < 4 * stepped  # rounds under the lag did cut some lines


FRESH = [  # two members; the one stopped at 128 steps starts a trial whose first chunk ends the run
    "population.size=2",
    "strategy=halving",
    "halving.first_rung=128",
    "train.total_env_steps=144",
    "replay.min_size=256",  # the fresh trial's policy: its first networks, no update yet
]


def fresh_trial(tmp_path: Path, preset: Path, *overrides: str):
    """(the fresh trial's policy, hparams, and the observations and actions of its first chunk
    after the reset row), from a halving run with no lag."""
    run = lagging_run(tmp_path, "fresh", *FRESH, *overrides, preset=preset, lag=0)
    ((event,),) = [[e for e in lineage(run.run_dir) if e["kind"] == "trial"]]
    member, learner = event["target"], run.learner
    pick = lambda tree: jax.tree.map(lambda leaf: leaf[member], tree)
    policy = pick(learner.training.policies(learner.states))
    rows = pick(learner.replay.buffers.rows)
    assert int(learner.replay.buffers.size[member]) == 16  # its own first chunk only
    assert bool(rows.autoreset[0, 0]) and bool(rows.episode_start[0, 1])  # a new episode
    return learner.agent, policy, pick(learner.hparams), rows.obs[0, 1:16], rows.action[0, 1:16]


def test_a_fresh_trials_warm_up_counts_its_own_steps(tmp_path):
    """TD3 without action noise: past the run's warm-up, the fresh trial's first steps are
    still its warm-up's random actions, not its policy's."""
    priors = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-2]}}"
    agent, policy, hparams, obs, actions = fresh_trial(
        tmp_path, PRESET, priors, "collect.warmup_steps=64", "hparams.exploration_noise=0.0"
    )
    acted = agent.act(policy, obs, jax.random.key(0), hparams, False)
    assert not np.allclose(np.asarray(acted), actions, atol=1e-3, rtol=0)


def test_a_fresh_trials_epsilon_counts_its_own_steps(tmp_path):
    """DQN whose epsilon decays from 1 to 0 over 64 env steps: the trial started at 128 acts
    at its own epsilon (near 1), not the run's (0, greedy)."""
    agent, policy, hparams, obs, actions = fresh_trial(
        tmp_path, DQN_PRESET, "population.priors={learning_rate: {log_uniform: [1.0e-4, 1.0e-2]}}",
        "collect.warmup_steps=0", "hparams.epsilon_start=1.0", "hparams.epsilon_end=0.0",
        "hparams.epsilon_decay_steps=64",
    )  # fmt: skip
    greedy = np.asarray(agent.act(policy, obs, jax.random.key(0), hparams, False))
    assert np.mean(greedy == actions) < 0.8

"""Resuming from a checkpoint: a learner saved and restored mid-run continues exactly as the
uninterrupted one (same transitions in, same member states out), for every algorithm and for
strategies with host-side (PBT, PB2) and device-side (CEM-RL) state; what a resume may change."""

from __future__ import annotations

import dataclasses
import errno
import json

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.commands import cli
from fastpop.learn.learner import Learner
from fastpop.population import replay
from fastpop.run import checkpoint, loop, resume, run_state
from fastpop.run.metrics import MetricsWriter
from fastpop.run.parts import build_learner, build_run
from fastpop.schema import ConfigError
from fastpop.strategies.base import Evaluation
from fastpop.strategies.codec import split_strategy_state
from tests.runs import SMALL

CHUNKS = 8  # chunks of collected rows fed to each learner; the interruption falls after half


def learner_for(*overrides: str) -> Learner:
    config = config_lib.load_config(None, [*SMALL, *overrides])
    learner = build_learner(config)
    learner.config = config  # what the tests read the learner's settings from
    return learner


def rows_for(learner: Learner, chunk: int) -> replay.Rows:
    """The same collected rows for every learner of one config: a function of the chunk."""
    rng = np.random.default_rng(chunk)
    config = learner.config
    lanes = config.population.size * config.collect.envs_per_member
    layout = replay.row_layout(learner.replay.spec, (lanes, config.collect.chunk_len))
    obs, action, reward, *flags = layout
    if np.issubdtype(action.dtype, np.integer):
        actions = rng.integers(0, 2, action.shape).astype(action.dtype)
    else:
        actions = rng.uniform(-1, 1, action.shape).astype(action.dtype)
    return replay.Rows(
        rng.normal(size=obs.shape).astype(obs.dtype),
        actions,
        rng.normal(size=reward.shape).astype(reward.dtype),
        *(rng.random(flag.shape) < 0.05 for flag in flags),
    )


def drive(learner: Learner, chunks: range) -> None:
    """Insert each chunk, update while the limiter allows, and every other chunk hand the
    strategy an evaluation round (returns: a fixed function of the round)."""
    size = learner.config.population.size
    for chunk in chunks:
        learner.insert(rows_for(learner, chunk))
        while learner.limiter.can_sample():
            learner.update()
        if chunk % 2:
            returns = np.random.default_rng(100 + chunk).normal(size=size)
            learner.strategy_step(Evaluation(chunk // 2, learner.limiter.inserted, returns))


def host(tree):
    return jax.tree.map(
        lambda x: np.asarray(jax.random.key_data(x) if checkpoint._is_key(x) else x), tree
    )


CASES = {
    "td3": [],
    "sac-sequential": ["algo=sac", "population.execution=sequential"],
    "dqn": ["algo=dqn", "env.id=CartPole-v1"],
    "td3-pbt-shared-replay": [
        "strategy=pbt",
        "pbt.interval=1",
        "replay.shared=true",
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
    ],
    "td3-pb2": [  # the GP's observations and each member's last return in the checkpoint
        "strategy=pb2",
        "pbt.interval=1",
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}, tau: {uniform: [0, 1]}}",
    ],
    "td3-halving": [  # rungs at 16, 32, 64 env steps: fresh trials mid-run
        "strategy=halving",
        "halving.first_rung=16",
        "halving.reduction_factor=2",
        "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}",
    ],
    "td3-cemrl": ["strategy=cemrl", "population.size=5", "replay.shared=true"],
    "td3-dvd": [
        "strategy=dvd",
        "population.size=3",
        "replay.shared=true",
        "dvd.embedding_states=4",
    ],
}


def assert_same_strategy_state(actual, expected) -> None:
    """Equal numbers (NaN where NaN) in the same places: arrays and plain data alike."""
    actual_arrays, actual_data = split_strategy_state(actual)
    expected_arrays, expected_data = split_strategy_state(expected)
    assert json.dumps(actual_data) == json.dumps(expected_data)
    for got, want in zip(actual_arrays, expected_arrays, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
def test_a_resumed_learner_continues_exactly_as_an_uninterrupted_one(tmp_path, overrides):
    uninterrupted = learner_for(*overrides)
    drive(uninterrupted, range(CHUNKS // 2))
    path = checkpoint.save(
        tmp_path,
        uninterrupted.limiter.inserted,
        uninterrupted.saved_tree(True),
        uninterrupted.saved_counters(),
    )
    drive(uninterrupted, range(CHUNKS // 2, CHUNKS))

    resumed = learner_for(*overrides)  # a fresh learner, as in a new process
    tree, counters = checkpoint.restore(path, resumed.saved_tree(True))
    resumed.restore(tree, counters)
    drive(resumed, range(CHUNKS // 2, CHUNKS))

    assert resumed.updates == uninterrupted.updates > 0
    assert resumed.saved_counters() == uninterrupted.saved_counters()
    expected, actual = host(uninterrupted.saved_tree(True)), host(resumed.saved_tree(True))
    assert jax.tree.structure(expected) == jax.tree.structure(actual)
    flat_expected = jax.tree_util.tree_flatten_with_path(expected)[0]
    flat_actual = jax.tree.leaves(actual)
    for (leaf_path, want), got in zip(flat_expected, flat_actual, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=jax.tree_util.keystr(leaf_path))
    if "strategy=pbt" in overrides or "strategy=pb2" in overrides:
        assert_same_strategy_state(resumed.strategy_state, uninterrupted.strategy_state)
        assert resumed.strategy_state.rounds == uninterrupted.strategy_state.rounds > 0


def test_without_saved_replay_learning_waits_for_the_buffers_to_refill(tmp_path):
    first = learner_for()
    drive(first, range(CHUNKS // 2))
    assert first.limiter.learning
    path = checkpoint.save(tmp_path, 1, first.saved_tree(False), first.saved_counters())
    resumed = learner_for()
    resumed.restore(*checkpoint.restore(path, resumed.saved_tree(False)))
    assert resumed.updates == first.updates
    assert resumed.limiter.inserted == first.limiter.inserted
    assert not resumed.limiter.learning and not resumed.limiter.can_sample()
    resumed.insert(rows_for(resumed, 0))  # 8 rows per member, replay.min_size is 16
    assert not resumed.limiter.can_sample()
    resumed.insert(rows_for(resumed, 1))
    assert resumed.limiter.can_sample()


def test_resume_refuses_unsafe_changes_and_names_what_may_change():
    saved = config_lib.config_to_dict(config_lib.load_config(None, SMALL))
    config = run_state.resume_config(saved, ["train.total_env_steps=50000"], "checkpoint")
    assert config.train.total_env_steps == 50000
    for override, name in [
        ("population.size=8", "population.size"),
        ("agent.hidden_sizes=[16,16]", "agent.hidden_sizes"),
        ("algo=sac", "algo"),
    ]:
        with pytest.raises(ConfigError, match=f"--set {name}: cannot change on resume") as info:
            run_state.resume_config(saved, [override], "checkpoint")
        assert "train.total_env_steps" in str(info.value)


# --- a Run's checkpoints without its processes ---


def run_with_checkpoint(run_dir):
    """A Run (no workers started) with some collected rows and one checkpoint written."""
    config = config_lib.load_config(None, [*SMALL, "log.tensorboard=false"])
    run = loop.Run(build_run(config), run_dir, log=lambda *_: None)
    run.learner.config = config  # what `rows_for` reads the learner's settings from
    run.metrics = MetricsWriter(run_dir, tensorboard=False)
    run.learner.insert(rows_for(run.learner, 0))
    run.checkpoints.save("interval")
    return run


def test_disk_full_stops_the_run_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    run = run_with_checkpoint(tmp_path)
    run.learner.insert(rows_for(run.learner, 1))

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    with pytest.raises(loop.TrainError) as stop:
        run.checkpoints.save_at_stop("interrupted")
    message = str(stop.value)
    assert "the disk is full" in message and "No space left on device" in message
    assert f"newest complete checkpoint: {tmp_path / 'checkpoints' / '000000000008'}" in message
    monkeypatch.undo()
    directory = tmp_path / "checkpoints"
    assert [p.name for p in directory.iterdir()] == ["000000000008"]  # no half-written one
    _, metadata, _ = checkpoint.restore_latest(directory, run.checkpoints.template)
    assert metadata["run"]["member_env_steps"] == 8 and metadata["run"]["reason"] == "interval"


def test_cli_resume_refuses_an_unsafe_change_and_touches_nothing(tmp_path, capsys):
    run_with_checkpoint(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    assert cli.main(["resume", str(tmp_path), "--set", "agent.hidden_sizes=[32,32]"]) == 2
    assert "--set agent.hidden_sizes: cannot change on resume" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_an_edited_config_file_is_refused_rather_than_ignored(tmp_path):
    run = run_with_checkpoint(tmp_path)
    edited = dataclasses.replace(run.config, seed=7)
    config_lib.save_config(
        dataclasses.replace(edited, log=run.config.log), tmp_path / "config.yaml"
    )
    with pytest.raises(ConfigError, match=r"config.yaml was edited after the checkpoint \(seed: 0"):
        resume.resume_run(tmp_path, [])
    # A resume-safe value written there is not an edit to refuse (--set decides it).
    longer = dataclasses.replace(run.config.train, total_env_steps=99_999)
    config_lib.save_config(dataclasses.replace(run.config, train=longer), tmp_path / "config.yaml")
    assert resume.resume_run(tmp_path, []).config.train.total_env_steps == 20_000


def test_an_unusable_newest_checkpoint_is_named_and_the_previous_one_used(tmp_path):
    run = run_with_checkpoint(tmp_path)
    run.learner.insert(rows_for(run.learner, 1))
    newest = run.checkpoints.save("interval")
    arrays = newest / checkpoint.ARRAYS
    arrays.write_bytes(arrays.read_bytes()[:1000])  # truncated
    said = []
    resumed = resume.resume_run(tmp_path, [], log=said.append)
    assert resumed.member_env_steps == 8
    assert any("000000000016" in line and "checksum mismatch" in line for line in said)


def test_a_resume_restores_what_the_rounds_and_checkpoints_hold_in_place(tmp_path):
    """The evaluation rounds and checkpoints are handed the loop's services, never the Run: a resume
    restores the progress and pending evaluations they share in place, where both see them."""
    run = run_with_checkpoint(tmp_path)
    meta = snapshot.SnapshotMeta(3, 8 * run.config.population.size, 0, 1.0)
    arrays = snapshot.encode(run.learner.policy_leaves(), meta)
    run.evaluations.pending.add(arrays, run.learner.all_member_hparams())
    run.checkpoints.save("interval")
    resumed = resume.resume_run(tmp_path, [])
    rounds, checkpoints = resumed.evaluations, resumed.checkpoints
    held = [*vars(rounds).values(), *rounds.services, *vars(checkpoints).values()]
    assert not any(isinstance(value, loop.Run) for value in held)
    assert resumed.progress.resumes == 1 and resumed.progress.last_checkpoint[1] == 8
    assert rounds.services.progress is resumed.progress is checkpoints.state.progress
    assert checkpoints.state.pending is rounds.pending and list(rounds.pending.snapshots) == [3]

"""ReplayStore: one interface over the shared, stacked and listed layouts; joins after a copy;
the learner waits for a sampleable transition; a run's progress survives a checkpoint."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.compilation import compile_stats
from fastpop.learn.learner import Learner
from fastpop.learn.replay_store import ReplayStore
from fastpop.population import replay
from fastpop.run import checkpoint
from fastpop.run import parts as run_parts
from fastpop.run.parts import build_learner
from fastpop.run.progress import PendingEvaluations, RunProgress
from fastpop.types import EnvSpec
from tests.helpers import program_names

# Frames of one pixel, stacked 4 deep: a frame's value names its stream and step.
STACKED = EnvSpec(obs_shape=(1, 1, 4), obs_dtype=np.dtype(np.uint8), num_actions=2, frame_stack=4)
CHUNK = 4


def stream_rows(values: list[np.ndarray], start: bool) -> replay.Rows:
    """One chunk, one lane per member: frame values as given, no episode ends."""
    obs = np.stack(values).astype(np.uint8).reshape(len(values), CHUNK, 1, 1, 1)
    flags = np.zeros((len(values), CHUNK), bool)
    starts = flags.copy()
    starts[:, 0] = start
    return replay.Rows(
        obs,
        np.zeros((len(values), CHUNK), np.int32),
        flags.astype(np.float32),
        flags,
        flags,
        flags,
        starts,
    )


def member_buffer(store: ReplayStore, member: int):
    if store.layout == "listed":
        return store.buffers[member]
    return population.member(store.buffers, member)


@pytest.mark.parametrize("layout", ["stacked", "listed"])
def test_no_sampled_transition_or_frame_stack_crosses_a_copied_buffers_join(layout):
    spec = replay.make_replay_spec(STACKED, capacity=64, lanes=1, chunk_len=CHUNK)
    store = ReplayStore(replay.Sampler(spec, 8), layout, size=2)
    # Member 0's environment writes frames 10, 11, ...; member 1's 100, 101, ...
    for chunk in range(6):
        if chunk == 3:  # PBT exploit with replay: copy: member 1 takes member 0's buffer
            store.copy_members(np.array([0, 0]))
        t = np.arange(chunk * CHUNK, (chunk + 1) * CHUNK)
        store.insert(stream_rows([10 + t, 100 + t], start=chunk == 0))
    batch = replay.sample(spec, member_buffer(store, 1), jax.random.key(0), 4096)
    obs, next_obs = np.asarray(batch.obs)[:, 0, 0], np.asarray(batch.next_obs)[:, 0, 0]
    frames = np.concatenate([obs, next_obs], axis=1)  # (4096, 8): both stacks of each sample
    from_source = frames < 100
    mixed = from_source.any(axis=1) & ~from_source.all(axis=1)
    assert not mixed.any(), frames[mixed][:5]
    # Both sides of the join are sampled: the copy and the member's own later rows.
    assert from_source.all(axis=1).any() and (~from_source).all(axis=1).any()
    assert not store.joins.any()  # the mark went into the first row after the copy


def test_join_marks_survive_a_checkpoint():
    spec = replay.make_replay_spec(STACKED, capacity=64, lanes=1, chunk_len=CHUNK)
    store = ReplayStore(replay.Sampler(spec, 8), "stacked", size=3)
    store.copy_members(np.array([0, 0, 2]))
    restored = ReplayStore(replay.Sampler(spec, 8), "stacked", size=3)
    restored.restore(jax.tree.map(np.asarray, store.save()), store.counters())
    assert restored.joins.tolist() == [False, True, False]


@pytest.mark.parametrize("saved_by,restored_into", [("stacked", "listed"), ("listed", "stacked")])
def test_listed_and_stacked_buffers_save_alike_and_restore_each_others(
    tmp_path, saved_by, restored_into
):
    """An Atari run lists its buffers on one CPU device and stacks them on several (or on an
    accelerator): a checkpoint of either resumes into the other, rows and positions intact."""
    spec = replay.make_replay_spec(STACKED, capacity=64, lanes=1, chunk_len=CHUNK)
    stores = {
        name: ReplayStore(replay.Sampler(spec, 8), name, size=2) for name in ("stacked", "listed")
    }
    for chunk in range(3):
        t = np.arange(chunk * CHUNK, (chunk + 1) * CHUNK)
        for store in stores.values():
            store.insert(stream_rows([10 + t, 100 + t], start=chunk == 0))
    saved = {name: jax.tree.map(np.asarray, store.save()) for name, store in stores.items()}
    assert_trees_equal(saved["listed"], saved["stacked"])
    tree = {"buffers": stores[saved_by].save()}
    path = checkpoint.save(tmp_path, 12, tree, {})
    restored = ReplayStore(replay.Sampler(spec, 8), restored_into, size=2)
    template = {"buffers": restored.save()}
    restored.restore(checkpoint.restore(path, template)[0]["buffers"], None)
    for member in range(2):
        assert_trees_equal(
            member_buffer(restored, member), member_buffer(stores[restored_into], member)
        )


def test_the_store_samples_with_the_runs_one_sampler(monkeypatch):
    """The replay store draws with the sampler the run's updates draw with (`run/parts.py`
    makes it once): with n-step returns its draws are n-step windows too, and the states DvD
    embeds (their `obs`) are those a one-step draw of the same key gives."""
    from tests.test_resume import rows_for

    handed, make_training = [], run_parts.make_training
    spy = lambda *args: handed.append(args[4]) or make_training(*args)  # its sample_batch
    monkeypatch.setattr(run_parts, "make_training", spy)
    overrides = ["agent.n_step=3", "agent.batch_size=4", "agent.hidden_sizes=[8,8]"]
    config = config_lib.load_config(None, ["algo=td3", "env.id=Pendulum-v1", *overrides])
    parts = run_parts.build_run(config).learner
    learner = Learner(parts)
    assert handed == [parts.sampler] and learner.replay.sampler is parts.sampler
    assert parts.sampler.n_step == 3 and learner.replay.spec is parts.replay_spec
    learner.config = config  # what rows_for reads
    for chunk in range(4):
        learner.insert(rows_for(learner, chunk))
    key = jax.random.key(5)
    batch = learner.replay.sample(key)
    buffer = member_buffer(learner.replay, 0)
    assert_trees_equal(batch, parts.sampler(buffer, key))
    assert batch.reward.shape == (4, 3)  # the window of an n-step draw
    one_step = replay.Sampler(parts.replay_spec, 4)(buffer, key)
    np.testing.assert_array_equal(np.asarray(batch.obs), np.asarray(one_step.obs))


def assert_trees_equal(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_the_learner_waits_until_every_buffer_holds_a_transition():
    # One row per lane per insert and min_size below the lanes: the limiter would allow the
    # first update after one insert, when each buffer's only row has no successor to pair with.
    config = config_lib.load_config(
        None,
        [
            "algo=td3",
            "env.id=Pendulum-v1",
            "population.size=2",
            "collect.envs_per_member=2",
            "collect.chunk_len=1",
            "replay.min_size=2",
            "replay.capacity=64",
            "agent.batch_size=4",
            "agent.hidden_sizes=[8,8]",
        ],
    )
    learner = build_learner(config)
    layout = replay.row_layout(learner.replay.spec, (4, 1))
    rows = replay.Rows(*(np.zeros(x.shape, x.dtype) for x in layout))
    learner.insert(rows._replace(episode_start=np.ones((4, 1), bool)))
    assert learner.limiter.can_sample() and not learner.can_update()
    learner.insert(rows)
    assert learner.can_update()


@pytest.mark.parametrize("layout", ["stacked", "listed"])
def test_whether_the_buffers_are_ready_reads_their_sizes_not_their_rows(layout):
    """Asked until the warm-up ends: each ask read (and copied) every buffer's rows once, ~0.2 s
    a time for two members' Pong replays, to stack their sizes."""
    spec = replay.make_replay_spec(STACKED, capacity=64, lanes=1, chunk_len=CHUNK)
    store = ReplayStore(replay.Sampler(spec, 8), layout, size=3)
    sizes = jax.make_jaxpr(store._layout.sizes)(store.buffers)
    made = [np.prod(v.aval.shape, dtype=int) for e in sizes.eqns for v in e.outvars]
    assert max(made, default=0) <= 3  # nothing row-sized made (stacked: the sizes as they are)
    assert np.asarray(store._layout.sizes(store.buffers)).tolist() == [0, 0, 0]


def test_run_progress_and_pending_evaluations_round_trip_through_plain_data():
    from fastpop.collect import snapshot

    progress = RunProgress(3, next_eval=200, eval_index=2, snapshot_env_steps=100, resumes=1)
    progress.training_returns[1].extend([1.0, 2.0])
    progress.latest_returns[:] = [1.0, np.nan, 3.0]
    progress.timers["update"] = 4.5
    saved = progress.saved()
    restored = RunProgress.restored(saved, 3, member_env_steps=150)
    assert restored.elapsed() >= saved["elapsed"]  # wall time continues from the total
    as_text = lambda data: json.dumps(data | {"elapsed": 0}, sort_keys=True)  # NaN == NaN
    assert as_text(restored.saved()) == as_text(saved | {"resumes": 2})
    assert restored.last_checkpoint == (saved["elapsed"], 150)

    pending = PendingEvaluations()
    for index in (4, 3):
        meta = snapshot.SnapshotMeta(index, 10 * index, index, 1.5)
        labels = [{"trial": index + 10}] if index == 4 else None
        facts = {"versions": [index], "trial_steps": [5], "updates": 7} if index == 4 else None
        pending.add(snapshot.encode([np.arange(3.0)], meta), [{"lr": index}], labels, facts)
    again = PendingEvaluations()
    again.restore(*pending.saved())
    assert [snapshot.decode(a)[1].eval_index for a in again.in_order()] == [3, 4]
    facts = {"versions": [4], "trial_steps": [5], "updates": 7}
    assert again.take(4) == ([{"lr": 4}], [{"trial": 14}], facts) and again.take(4) is None
    assert again.take(3) == ([{"lr": 3}], None, None)


COMPILED = program_names(compile_stats.BACKEND)  # compiled (a cache hit counts too)


@pytest.mark.parametrize("layout", ["shared", "stacked", "listed"])
def test_the_insert_compiled_ahead_is_the_program_the_first_insert_runs(layout):
    """Process mode compiles the insert while collectors start: the first chunk compiles no
    add program of its own."""
    size, lanes = 3, 2
    spec = replay.make_replay_spec(STACKED, capacity=64, lanes=lanes, chunk_len=CHUNK)
    store = ReplayStore(replay.Sampler(spec, 4), layout, size)
    COMPILED.clear()
    store.compile_insert_ahead().result()
    assert COMPILED.count("jit(add)") == 1
    COMPILED.clear()
    rows = lanes * (1 if layout == "shared" else size)
    store.insert(stream_rows([np.arange(CHUNK) + 10 * lane for lane in range(rows)], True))
    assert "jit(add)" not in COMPILED, COMPILED
    assert np.asarray(store._layout.sizes(store.buffers)).min() == CHUNK  # the rows went in


@pytest.mark.parametrize(
    "strategy",
    [
        ["population.size=2"],  # the vectorized executor (its chunk programs)
        ["strategy=cemrl", "population.size=5", "replay.shared=true"],  # a jitted Learning
    ],
)
def test_the_update_compiled_ahead_is_the_program_the_first_update_runs(strategy):
    """Process mode compiles the update from the learner's shapes while the collectors step
    their warm-up: the first update, once the rows are in, compiles nothing."""
    from tests.test_resume import learner_for, rows_for

    learner = learner_for(*strategy)
    learner.compile_update_ahead()
    chunk = 0
    while not learner.can_update():
        learner.insert(rows_for(learner, chunk))
        chunk += 1
    learner.calls.ahead.result()
    COMPILED.clear()
    learner.update()
    assert COMPILED == [], COMPILED

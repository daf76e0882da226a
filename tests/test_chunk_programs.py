"""Device mode's two compiled calls per chunk (rows and insert; updates): the same numbers as
the same steps made one call at a time, and exactly the update calls samples_per_insert allows."""

from __future__ import annotations

import threading
from pathlib import Path

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.collect.device_collection import DeviceCollection
from fastpop.compilation import compile_stats
from fastpop.learn.learner import Learner
from fastpop.run.parts import build_run
from fastpop.run.startup import make_collection
from fastpop.strategies.base import Evaluation
from tests.dependencies import require
from tests.helpers import program_names

require("gymnax")
# gymnax's Pendulum compiles in a second (brax's envs in tens): the numbers compared, not
# learning; the rollout is one code path for every family.
PRESET = Path(__file__).resolve().parents[1] / "configs" / "td3_gymnax_pendulum_cpu.yaml"
SMALL = [
    "population.size=2",
    "collect.envs_per_member=2",
    "agent.hidden_sizes=[16,16]",
    "agent.batch_size=16",
    "replay.samples_per_insert=12",  # 0.75 updates per env step: calls per chunk vary
    "replay.min_size=24",
    "collect.warmup_steps=16",
    "collect.chunk_len=8",
    "train.updates_per_call=2",
    "env.episode_length=30",  # time limits inside the chunks
]
CHUNKS = 8


def learner_and_collection(config) -> tuple[Learner, DeviceCollection]:
    parts = build_run(config)
    learner = Learner(parts.learner)
    return learner, make_collection(parts, learner)


def one_call_at_a_time(learner: Learner, collection: DeviceCollection) -> int:
    """What `collection.feed(learner)` does, as separate calls; returns the update calls."""
    collection.key, key = jax.random.split(collection.key)
    steps = np.int32(learner.limiter.inserted)
    collection.lanes, rows = collection._chunk(
        collection.lanes, key, learner.states, learner.hparams, steps
    )
    learner.insert(rows)
    calls = learner.limiter.calls_due() if learner.limiter.inserted >= 2 * 2 else 0
    for _ in range(calls):
        learner.update()
    return calls


def test_the_chunk_programs_equal_the_calls_made_one_at_a_time():
    config = config_lib.load_config(PRESET, SMALL)
    chunked, chunked_collection = learner_and_collection(config)
    stepped, stepped_collection = learner_and_collection(config)
    calls_made = []
    for _ in range(CHUNKS):
        chunked_collection.feed(chunked)
        calls_made.append(one_call_at_a_time(stepped, stepped_collection))
        assert chunked.updates == stepped.updates
        assert chunked.limiter.sampled == stepped.limiter.sampled

    # Learning starts after 24 rows per member (chunk 2 of 16 rows); then 12 samples per row
    # in calls of 2 x 16 samples: 16 rows -> 192 samples -> 6 calls per chunk, exactly.
    assert calls_made == [0, 0, 6, 6, 6, 6, 6, 6]
    limiter = chunked.limiter
    target = limiter.samples_per_insert * (limiter.inserted - limiter.inserted_at_start)
    assert limiter.sampled == target and chunked.updates == sum(calls_made) * 2
    for name, a, b in (
        ("states", chunked.states, stepped.states),
        ("replay", chunked.replay.buffers, stepped.replay.buffers),
        ("env lanes", chunked_collection.lanes, stepped_collection.lanes),
    ):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
                x, y = jax.random.key_data(x), jax.random.key_data(y)
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6, err_msg=name)


def test_the_program_runs_every_call_the_rows_allow_and_no_more():
    """Sampled stays within one call below samples_per_insert x inserted after every chunk, for
    a ratio whose chunks do not hold a whole number of calls (80 samples, calls of 32)."""
    samples_per_insert = 5.0
    overrides = [*SMALL, f"replay.samples_per_insert={samples_per_insert}"]
    config = config_lib.load_config(PRESET, overrides)
    learner, collection = learner_and_collection(config)
    limiter = learner.limiter
    for _ in range(6):
        collection.feed(learner)
        if limiter.learning:
            target = samples_per_insert * (limiter.inserted - limiter.inserted_at_start)
            assert target - limiter.samples_per_call < limiter.sampled <= target
    assert learner.updates == limiter.sampled // learner.agent.batch_size


def test_the_evaluation_compiled_beside_the_loop_equals_the_jitted_call():
    """running() compiles the evaluation program in a thread once the first update calls
    have run, while the loop trains; evaluating a snapshot with it gives the jitted call's
    returns, bit for bit."""
    config = config_lib.load_config(PRESET, [*SMALL, "eval.episodes=2"])
    learner, collection = learner_and_collection(config)
    running = collection.running(learner, log_event=None, generation=0)
    running.__enter__()
    while not learner.updates:  # not beside the chunk program's compile or the warm-up
        assert collection.evaluations() == []  # the loop asks every pass
        assert collection.evaluation.compiling is None
        collection.feed(learner)
    assert collection.evaluation.compiling is not None
    collection.feed(learner)
    meta = snapshot.SnapshotMeta(eval_index=1, env_steps=96, updates=6, wall_time=0.0)
    arrays = snapshot.encode(learner.policy_leaves(), meta)
    collection.evaluate(arrays)
    [result] = collection.evaluations(timeout=120)  # independent members: maybe compiling still
    assert isinstance(collection.evaluation.program(), jax.stages.Compiled)
    evaluation = collection.evaluation
    policy, hparams, _ = jax.tree.unflatten(evaluation.treedef, snapshot.decode(arrays)[0])
    jitted = evaluation.jitted(policy, hparams, evaluation.key(meta))
    returns = np.asarray(jitted, np.float64)
    assert returns.shape == (2, 2) and result["eval_index"] == 1
    assert result["return_mean"] == returns.mean(axis=1).tolist()
    assert result["return_std"] == returns.std(axis=1).tolist()


@pytest.mark.parametrize("acts_on_evaluations", [False, True], ids=["independent", "acting"])
def test_a_snapshot_handed_in_while_the_evaluation_compiles(monkeypatch, acts_on_evaluations):
    """Independent members: a snapshot handed in before the evaluation program has compiled
    waits for it while the chunks go on. A strategy that acts on evaluations (PBT) waits for
    the program at the snapshot instead, so that its rounds come at the same chunk in every
    run. Either way the returns are the jitted call's."""
    config = config_lib.load_config(PRESET, [*SMALL, "eval.episodes=2"])
    learner, collection = learner_and_collection(config)
    assert learner.strategy.acts_on_evaluations is False  # the preset's independent members
    entry = learner.strategy.entry._replace(acts_on_evaluations=acts_on_evaluations)
    learner.strategy = learner.strategy._replace(entry=entry)
    release, compile_evaluation = threading.Event(), collection.evaluation._compile

    def held_back():
        release.wait(120)
        return compile_evaluation()

    monkeypatch.setattr(collection.evaluation, "_compile", held_back)
    meta = snapshot.SnapshotMeta(eval_index=1, env_steps=96, updates=6, wall_time=0.0)
    with collection.running(learner, log_event=None, generation=0):
        while not learner.updates:
            collection.feed(learner)
        arrays = snapshot.encode(learner.policy_leaves(), meta)
        if acts_on_evaluations:
            threading.Timer(0.5, release.set).start()
            collection.evaluate(arrays)  # returns once the program has compiled and run
            [result] = collection.evaluations()
        else:
            collection.evaluate(arrays)  # returns at once
            updates = learner.updates
            for _ in range(2):
                collection.feed(learner)
            assert learner.updates > updates and collection.evaluations() == []
            release.set()
            [result] = collection.evaluations(timeout=120)
    evaluation = collection.evaluation
    policy, hparams, _ = jax.tree.unflatten(evaluation.treedef, snapshot.decode(arrays)[0])
    jitted = evaluation.jitted(policy, hparams, evaluation.key(meta))
    assert result["return_mean"] == np.asarray(jitted, np.float64).mean(axis=1).tolist()


@pytest.mark.parametrize("acts_on_evaluations", [False, True], ids=["independent", "acting"])
def test_a_round_of_independent_members_draws_no_key(acts_on_evaluations):
    """Independent members' rounds change no state, so they leave the learner's key as it is:
    the update keys, and so a device-mode run's numbers, do not depend on which chunk an
    evaluation deferred past its program's compile comes back after. Strategies that act on
    evaluations draw their round's key from it."""
    learner, _ = learner_and_collection(config_lib.load_config(PRESET, SMALL))
    entry = learner.strategy.entry._replace(acts_on_evaluations=acts_on_evaluations)
    learner.strategy = learner.strategy._replace(entry=entry)
    key = host(learner.key)
    learner.strategy_step(Evaluation(0, 16, np.array([-900.0, -800.0])))
    assert np.array_equal(host(learner.key), key) is not acts_on_evaluations


def test_the_chunk_programs_and_lanes_made_beside_the_learner_equal_those_made_after_it():
    """A run (run/startup.start_device) traces device mode's chunk programs from the learner's
    shapes while the learner is made in a thread, compiles each in a thread as soon as it is
    traced and makes the env lanes in a thread: the first chunk compiles nothing more, and every
    chunk gives the numbers of a collection that made them after a learner made first, bit for
    bit."""
    parts = build_run(config_lib.load_config(PRESET, SMALL))
    ahead = DeviceCollection(parts.device)  # no policy template yet
    learner_ahead = ahead.make_ahead(parts.learner)
    assert ahead.env_lanes._ahead is not None and ahead._programs_ahead is not None
    learner = learner_ahead.result()
    ahead.set_policy_template(learner.policy_template())  # as run/startup.start_device does
    for compiling in ahead._programs_ahead[1:]:
        compiling.result()
    compiled = program_names(compile_stats.BACKEND)
    ahead.feed(learner)
    assert compiled == []  # compiled for the very arguments the first chunk passes

    other = build_run(config_lib.load_config(PRESET, SMALL))
    after_learner = Learner(other.learner)
    after = make_collection(other, after_learner)
    after.feed(after_learner)
    for _ in range(CHUNKS - 1):
        ahead.feed(learner)
        after.feed(after_learner)
    assert ahead._programs._cache_size() == 2
    assert ahead.evaluation.treedef == after.evaluation.treedef
    for name, a, b in (
        ("states", learner.states, after_learner.states),
        ("replay", learner.replay.buffers, after_learner.replay.buffers),
        ("env lanes", ahead.lanes, after.lanes),
    ):
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(host(x), host(y), err_msg=name)


def test_the_chunk_programs_trace_the_envs_reset_and_step_and_the_update_once(monkeypatch):
    """Before the first chunk a run traces its env's reset for the memory check's lanes shapes
    and again inside the collect program, and the update program took its metrics' shapes from
    the update before its loop traced it: each is traced once (envs/device_envs jits the env,
    collect/chunk_programs jits the update), not once per use (~1 s of a cold brax start's
    tracing)."""
    from fastpop.envs import device_envs, gymnax_envs

    traced = {"reset": 0, "step": 0, "update": 0}

    def counted(name, function):
        def counting(*args):
            traced[name] += 1
            return function(*args)

        return counting

    make = gymnax_envs.make

    def counting_env(env_id, backend=None):
        env = make(env_id, backend)
        return env._replace(reset=counted("reset", env.reset), step=counted("step", env.step))

    monkeypatch.setattr(gymnax_envs, "make", counting_env)
    device_envs.make_device_env.cache_clear()  # built anew with the counting env, and after
    try:
        parts = build_run(config_lib.load_config(PRESET, SMALL))
        training = parts.learner.training
        training = training._replace(update=counted("update", training.update))
        parts = parts._replace(
            learner=parts.learner._replace(training=training),
            device=parts.device._replace(training=training),
        )
        ahead = DeviceCollection(parts.device)
        ahead.make_ahead(parts.learner).result()
        for compiling in ahead._programs_ahead[1:]:
            compiling.result()
    finally:
        device_envs.make_device_env.cache_clear()
    assert traced == {"reset": 1, "step": 1, "update": 1}


def host(leaf) -> np.ndarray:
    is_key = jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    return np.asarray(jax.random.key_data(leaf) if is_key else leaf)

"""Traced programs kept on disk (fastpop/compilation/stored_programs.py): a rerun loads them
instead of tracing, with the same numbers; what they are keyed by; what is not stored; bounded.

The store is on only where the compilation cache is (`compile_cache.is_on`): these tests turn it
on in this process with a temporary FASTPOP_CACHE_DIR.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.compilation import (
    compile_cache,
    compile_stats,
    program_store,
    static_codec,
    stored_programs,
)
from tests.dependencies import require
from tests.helpers import program_names, train_here
from tests.runs import REPO, read_jsonl
from tests.test_device_mode import SHORT

require("gymnax")

GYMNAX = REPO / "configs" / "td3_gymnax_pendulum_cpu.yaml"


class Pair(NamedTuple):
    weights: jax.Array
    count: jax.Array


@flax.struct.dataclass
class Lane:
    state: jax.Array
    label: str = flax.struct.field(pytree_node=False, default="lane")


class Wrapped:
    """A hashable wrapper of one NumPy array, as MuJoCo MJX keeps arrays in static data."""

    def __init__(self, array: np.ndarray):
        self.array = array

    def __hash__(self):
        return hash(self.array.tobytes())

    def __eq__(self, other):
        return isinstance(other, Wrapped) and np.array_equal(self.array, other.array)


@flax.struct.dataclass
class MjxLike:
    state: jax.Array
    masses: Wrapped = flax.struct.field(pytree_node=False)
    count: np.int64 = flax.struct.field(pytree_node=False)


class Traces:
    """How often each Python function was traced (a traced program runs its Python body)."""

    def __init__(self):
        self.count = 0

    def step(self, key, pair: Pair, lane: Lane):
        self.count += 1
        noise = jax.random.normal(key, pair.weights.shape)
        weights = jnp.tanh(pair.weights @ pair.weights.T) + noise
        return Pair(weights, pair.count + 1), {"lane": Lane(lane.state * 2), "sum": weights.sum()}


def arguments(width: int = 4):
    pair = Pair(jnp.arange(width * width, dtype=jnp.float32).reshape(width, width) / 10, 0)
    return jax.random.key(3), pair._replace(count=jnp.int32(0)), Lane(jnp.ones(width))


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on, in tmp_path/programs."""
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(stored_programs.SWITCH, raising=False)  # tests/conftest.py's
    monkeypatch.setattr(compile_cache, "is_on", lambda: True)
    return tmp_path / "programs"


def test_a_second_process_loads_the_program_without_tracing_it_same_numbers(store):
    traces = Traces()
    expected = jax.jit(Traces().step)(*arguments())
    first = stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    assert traces.count == 1 and len(list(store.glob("step-*.program"))) == 1
    loaded_before = program_store.counts()["loaded"]
    fresh = stored_programs.stored_jit(traces.step, "identity", "step")  # as a rerun makes it
    again = fresh(*arguments())
    assert traces.count == 1  # loaded: the function was not traced
    assert program_store.counts()["loaded"] == loaded_before + 1
    for result in (first, again):
        assert jax.tree.structure(result) == jax.tree.structure(expected)
        for got, want in zip(jax.tree.leaves(result), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(got, want)
    fresh(*arguments())
    assert traces.count == 1  # and kept for the next call
    compiled = fresh.lower(*arguments()).compile()  # what device evaluation compiles ahead
    np.testing.assert_array_equal(compiled(*arguments())[1]["sum"], expected[1]["sum"])


def test_another_identity_name_or_shape_is_traced_and_stored_beside(store):
    traces = Traces()
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    stored_programs.stored_jit(traces.step, "another", "step")(*arguments())
    stored_programs.stored_jit(traces.step, "identity", "other")(*arguments())
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments(width=5))
    assert traces.count == 4  # none loaded another's program
    assert len(list(store.glob("*.program"))) == 4


def test_static_data_with_wrapped_arrays_is_stored_and_found_again(store):
    """MJX's nodes keep NumPy arrays (wrapped) and scalars as static data, whose repr holds an
    address: stored all the same, and found again from new objects of the same values."""

    def mjx_like():
        return MjxLike(jnp.ones(3), Wrapped(np.arange(3.0)), np.int64(2))

    traces = []

    def scale(node):
        traces.append(1)
        return node.replace(state=node.state * node.masses.array.sum() + node.count)

    first = stored_programs.stored_jit(scale, "identity", "scale")(mjx_like())
    again = stored_programs.stored_jit(scale, "identity", "scale")(mjx_like())  # a rerun
    assert len(traces) == 1 and len(list(store.glob("scale-*.program"))) == 1
    assert again.masses == Wrapped(np.arange(3.0)) and again.count == 2
    np.testing.assert_array_equal(again.state, first.state)


def test_the_static_codec_reads_back_what_it_writes_and_refuses_the_rest():
    values = (None, True, 3, 2.5, "x", (1, [2, (3,)]), np.arange(6, dtype=np.float32).reshape(2, 3))
    values += (np.int64(7), Wrapped(np.ones(2, np.int32)))
    again = static_codec.decode(static_codec.encode(values))
    assert type(again) is tuple and len(again) == len(values)
    for got, want in zip(again, values, strict=True):
        assert type(got) is type(want)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype and np.array_equal(got, want)
        else:
            assert got == want
    for refused in (object(), np.array([object()]), {"a": 1}):
        with pytest.raises(TypeError):
            static_codec.encode((refused,))


def test_the_fingerprint_reads_every_source_of_the_package():
    """A program stored by other code is not loaded: fastpop's sources outside
    fastpop/compilation (the rollout, the agents) decide device mode's programs too."""
    package = Path(stored_programs.__file__).resolve().parents[1]
    names = {path.relative_to(package).as_posix() for path in stored_programs.source_files()}
    assert {"collect/device_rollout.py", "agents/td3.py", "compilation/stored_programs.py"} <= names


def test_no_identity_is_plain_jit(store):
    program = stored_programs.stored_jit(lambda x: x + 1, None, "add")
    assert not isinstance(program, stored_programs.StoredJit)
    np.testing.assert_array_equal(program(jnp.zeros(2)), [1.0, 1.0])
    assert not store.exists()


def test_donated_arguments_stay_donated(store):
    def add(x, y):
        return x + y

    x = jnp.arange(4.0)
    out = stored_programs.stored_jit(add, "identity", "add", donate_argnums=(0,))(x, x + 1)
    np.testing.assert_array_equal(out, [1.0, 3.0, 5.0, 7.0])
    assert x.is_deleted()
    y = jnp.arange(4.0)
    out = stored_programs.stored_jit(add, "identity", "add", donate_argnums=(0,))(y, y + 1)
    assert y.is_deleted() and program_store.counts()["loaded"] >= 1


def test_compiler_options_reach_the_compile_whether_exported_now_or_loaded(store):
    # An option XLA does not know makes the compile fail: it was passed on.
    options = {"xla_cpu_no_such_option": True}
    for _ in ("exported now", "loaded"):
        program = stored_programs.stored_jit(lambda x: x + 1, "identity", "add", (), options)
        with pytest.raises(jax.errors.JaxRuntimeError, match="xla_cpu_no_such_option"):
            program(jnp.zeros(2))
        with pytest.raises(jax.errors.JaxRuntimeError, match="xla_cpu_no_such_option"):
            program.lower(jnp.zeros(2)).compile()  # what device mode compiles ahead
    assert len(list(store.glob("add-*.program"))) == 1 and program_store.counts()["loaded"]


def test_an_unreadable_stored_program_is_exported_again_with_a_warning(store, caplog):
    traces = Traces()
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    (path,) = store.glob("step-*.program")
    path.write_bytes(path.read_bytes()[:200])  # truncated by a crash, say
    with caplog.at_level(logging.WARNING, logger="fastpop.compilation.program_store"):
        result = stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    assert "ignoring the stored program" in caplog.text
    assert traces.count == 2  # traced again, and written again whole
    expected = jax.jit(Traces().step)(*arguments())
    np.testing.assert_array_equal(result[1]["sum"], expected[1]["sum"])
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    assert traces.count == 2  # the rewritten file loads


def test_what_cannot_be_exported_runs_as_plain_jit(store):
    seen = []

    def with_callback(x):
        jax.debug.callback(lambda value: seen.append(float(value)), x.sum())
        return x * 2

    before = program_store.counts()["not_stored"]
    out = stored_programs.stored_jit(with_callback, "identity", "callback")(jnp.ones(3))
    np.testing.assert_array_equal(out, [2.0, 2.0, 2.0])
    assert seen == [3.0] and program_store.counts()["not_stored"] == before + 1
    assert not list(store.glob("callback-*"))


@pytest.mark.parametrize("off", ["compilation cache", "FASTPOP_STORED_PROGRAMS=0"])
def test_nothing_is_stored_while_turned_off(tmp_path, monkeypatch, off):
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(stored_programs.SWITCH, "0" if off.startswith("FASTPOP") else "1")
    monkeypatch.setattr(compile_cache, "is_on", lambda: off.startswith("FASTPOP"))
    traces = Traces()
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    assert not (tmp_path / "programs").exists()


def test_the_store_keeps_the_most_recently_used_programs_within_its_size(store, monkeypatch):
    traces = Traces()
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments())
    (first,) = store.glob("*.program")
    monkeypatch.setenv(program_store.MAX_BYTES_VARIABLE, str(first.stat().st_size + 1))
    stored_programs.stored_jit(traces.step, "identity", "step")(*arguments(width=5))
    assert [path.name for path in store.glob("*.program")] != [first.name]
    assert len(list(store.glob("*.program"))) == 1  # the older one went


def test_concurrent_writers_of_one_program_leave_one_whole_file(store):
    traces = Traces()
    programs = [stored_programs.stored_jit(traces.step, "same", "step") for _ in range(3)]
    threads = [threading.Thread(target=program, args=arguments()) for program in programs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(list(store.glob("*"))) == 1  # no temporary file left
    traced = traces.count
    stored_programs.stored_jit(traces.step, "same", "step")(*arguments())
    assert traced <= 3 and traces.count == traced  # whoever wrote last, the file loads


def test_one_program_called_in_a_thread_while_asked_for_its_shapes_is_traced_once(store):
    """Device mode calls its lanes' program in a thread while the main thread asks it for its
    output shapes: one of them exports (traces) it, the other uses that export."""
    traces = Traces()

    def slow_step(*args):  # long enough to trace that both threads would be at it at once
        time.sleep(0.3)
        return traces.step(*args)

    program = stored_programs.stored_jit(slow_step, "one", "step")
    gate, results = threading.Barrier(2), {}
    written = program_store.counts()["written"]

    def call():
        gate.wait()
        results["call"] = program(*arguments())

    thread = threading.Thread(target=call)
    thread.start()
    gate.wait()
    shapes = program.output_shapes(*arguments())
    thread.join()
    assert traces.count == 1 and program_store.counts()["written"] == written + 1
    assert jax.tree.map(lambda x: (x.shape, x.dtype), shapes) == jax.tree.map(
        lambda x: (x.shape, x.dtype), results["call"]
    )


# --- device mode: the chunk's programs, the evaluation and the env lanes' reset ---

TRACED = program_names(compile_stats.TRACE)
# the chunk's programs' and the evaluation's names
DEVICE_PROGRAMS = {"collect_chunk", "chunk_updates", "_evaluate_members"}


def rows(run) -> list[dict]:
    return [
        {k: v for k, v in row.items() if k not in ("wall_time", "learner_evaluation_seconds")}
        for row in read_jsonl(run.run_dir / "metrics.jsonl")
    ]


def test_a_device_mode_rerun_loads_its_programs_and_writes_the_same_rows(store, tmp_path):
    settings = [*SHORT, "train.total_env_steps=512"]
    plain_dir, first_dir, second_dir = (tmp_path / name for name in ("plain", "first", "again"))
    for directory in (plain_dir, first_dir, second_dir):
        directory.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compile_cache, "is_on", lambda: False)
        plain = train_here(plain_dir, GYMNAX, *settings)
    written = program_store.counts()["written"]
    first = train_here(first_dir, GYMNAX, *settings)
    assert program_store.counts()["written"] == written + 4
    assert {path.name.split("-")[0] for path in store.glob("*.program")} == {
        "collect",
        "update",
        "evaluate",
        "lanes",
    }
    TRACED.clear()
    loaded = program_store.counts()["loaded"]
    second = train_here(second_dir, GYMNAX, *settings, "seed=0", "log.progress_interval_seconds=5")
    # collect, update, evaluate, and lanes twice: its shapes for the memory check, then the lanes
    assert program_store.counts()["loaded"] == loaded + 5
    assert not DEVICE_PROGRAMS & set(TRACED), TRACED
    assert rows(plain) == rows(first) == rows(second) and len(rows(plain)) == 2  # 2 members
    for run in (first, second):  # the arrays each chunk feeds back make no second variant
        assert run.collection._programs._cache_size() == 2


def test_a_reruns_env_state_bytes_come_from_the_stored_lanes_program_untraced(store):
    from fastpop.collect import device_rollout
    from fastpop.envs.device_envs import make_device_env

    env, traced = make_device_env("gymnax/Pendulum-v1"), []

    def reset(key):
        traced.append(key)
        return env.reset(key)

    counting = env._replace(reset=reset)
    shapes = jax.eval_shape(lambda key: device_rollout.init(env, key, 10), jax.random.key(0))
    expected = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))
    assert device_rollout.env_state_bytes(counting, 10, made=4, identity="identity") == expected
    assert traced  # exported, and stored as device mode's "lanes" program of 4 lanes
    traced.clear()
    assert device_rollout.env_state_bytes(counting, 10, made=4, identity="identity") == expected
    assert not traced  # a rerun reads the shapes from the stored program


def test_fields_left_out_of_the_identity_change_no_program(tmp_path, monkeypatch):
    """Each field of NOT_IN_PROGRAMS changed at once: the programs exported are byte for byte
    those of the base config (were one read, the rerun would load a wrong program)."""
    monkeypatch.setattr(compile_cache, "is_on", lambda: True)
    monkeypatch.delenv(stored_programs.SWITCH, raising=False)
    base = [*SHORT, "train.total_env_steps=256"]
    changed = [
        "name=other",
        "seed=7",
        "hparams.actor_lr=0.002",
        "log.progress_interval_seconds=9",
        "checkpoint.keep=5",
        "train.total_env_steps=512",
        "train.max_wall_seconds=99",
        "eval.interval=256",
    ]
    blobs = []
    for index, overrides in enumerate((base, [*base, *changed])):
        monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path / str(index)))
        (tmp_path / f"run{index}").mkdir()
        train_here(tmp_path / f"run{index}", GYMNAX, *overrides)
        programs = sorted((tmp_path / str(index) / "programs").glob("*.program"))
        blobs.append({path.name: path.read_bytes() for path in programs})
    assert len(blobs[0]) == 4 and blobs[0] == blobs[1]  # collect, update, evaluate, lanes


def test_an_edited_plugin_keys_its_programs_anew(tmp_path, monkeypatch):
    """A plugin's code decides the programs of a run that names it (an algorithm's update): the
    identity they are stored under hashes its source, so an edited plugin is traced again
    rather than loaded stale. (Before, only fastpop's own sources keyed them.)"""
    from fastpop.run.parts import program_identity

    (tmp_path / "edited_plugin.py").write_text("SCALE = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "edited_plugin", raising=False)
    config = config_lib.load_config(GYMNAX, ["plugins=[edited_plugin]"])
    before = program_identity(config)
    assert program_identity(config) == before  # the same source, the same identity
    (tmp_path / "edited_plugin.py").write_text("SCALE = 2.0\n")
    assert program_identity(config) != before

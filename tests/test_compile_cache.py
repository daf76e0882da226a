"""fastpop's persistent compilation cache (fastpop/compilation/compile_cache.py): used, off when
turned off, a user's directory left as the user set it, concurrent writers, unreadable entries.

Every case runs in its own Python process with its own environment and a temporary cache
directory: the suite's own cache (tests/conftest.py sets JAX_COMPILATION_CACHE_DIR, which as a
user's setting would win) never takes part, and JAX opens its cache once per process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import with_this_checkout

# Compiles a few programs (one of them sized by argv[1], so two processes can differ) and
# prints the cache status and the compile counts as JSON.
PROGRAM = """
import json, os, sys
from fastpop.compilation import compile_cache, compile_stats, every_process_writes
status = compile_cache.enable()
compile_stats.install()
installed = None
if "AS_PROCESS" in os.environ:  # what a `--distributed` process of that index does
    from jax._src import distributed
    distributed.global_state.process_id = int(os.environ["AS_PROCESS"])
    installed = every_process_writes.install() if "EVERY_PROCESS_WRITES" in os.environ else None
if len(sys.argv) > 2:
    from fastpop.config import load_config
    from fastpop.run.parts import build_run
    config = load_config(None, ["env.id=gymnax/Pendulum-v1", "train.compile_cache=false"])
    build_run(config)
    status = compile_cache.status()
import jax, jax.numpy as jnp
width = int(sys.argv[1])
x = jnp.ones((width, width))
y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(0))(x)
z = jax.jit(lambda a, b: jnp.cumsum(a * b))(y, y)
print(json.dumps({"status": status, "value": float(z[-1]), **compile_stats.counts(),
                  "every_process_writes": installed,
                  "max_size": jax.config.values["jax_compilation_cache_max_size"]}))
"""


def environment(tmp_path: Path, **extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE", "FASTPOP_COMPILE"))
    }
    return with_this_checkout(env) | {"FASTPOP_CACHE_DIR": str(tmp_path / "cache")} | extra


def start(env: dict, width: int = 8, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(width), *args],
        env=env,
        cwd=Path(__file__).parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[dict, str]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def run(env: dict, width: int = 8, *args: str) -> tuple[dict, str]:
    return finish(start(env, width, *args))


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*-cache")) if directory.is_dir() else []


def test_second_process_loads_every_program_from_the_cache(tmp_path):
    env = environment(tmp_path)
    first, _ = run(env)
    owned = tmp_path / "cache" / "jax-compile"
    assert first["status"] == f"{owned} (fastpop's)"
    assert first["compiled"] == first["programs"] >= 2 and first["from_cache"] == 0
    assert len(entries(owned)) == first["cache_writes"] >= 2  # small programs kept too
    assert first["max_size"] == 1 << 30  # bounded: JAX evicts the least recently used
    second, _ = run(env)
    assert second["programs"] == first["programs"]
    assert second["from_cache"] == second["programs"] and second["compiled"] == 0
    assert second["value"] == first["value"]


@pytest.mark.parametrize(
    "how", [{"FASTPOP_COMPILE_CACHE": "0"}, {"FASTPOP_CACHE_DIR": ""}, "train.compile_cache"]
)
def test_turned_off_nothing_is_written(tmp_path, how):
    args = ("config",) if how == "train.compile_cache" else ()
    env = environment(tmp_path, **({} if isinstance(how, str) else how))
    result, _ = run(env, 8, *args)
    assert result["status"].startswith("off (") and result["from_cache"] == 0
    assert result["compiled"] == result["programs"] > 0
    written = entries(tmp_path / "cache" / "jax-compile")
    if how == "train.compile_cache":  # off from the moment the run is built
        written = [path for path in written if "lambda" in path.name]
    assert not written


def test_a_users_cache_directory_wins_and_keeps_jax_settings(tmp_path):
    users = tmp_path / "mine"
    env = environment(tmp_path, JAX_COMPILATION_CACHE_DIR=str(users))
    (users).mkdir()
    orphan = users / "0123-cache"  # fastpop tidies only its own directory
    orphan.write_bytes(b"not fastpop's")
    result, _ = run(env)
    assert result["status"] == f"{users} (yours: JAX_COMPILATION_CACHE_DIR)"
    assert result["max_size"] == -1  # JAX's default: nothing evicted in a user's directory
    assert orphan.read_bytes() == b"not fastpop's"
    assert not (tmp_path / "cache" / "jax-compile").exists()


def test_two_processes_writing_at_once_both_succeed(tmp_path):
    env = environment(tmp_path)
    processes = [start(env, width) for width in (8, 8, 9)]
    results = [finish(process) for process in processes]
    for _, err in results:
        assert "persistent compilation cache" not in err, err
    assert results[0][0]["value"] == results[1][0]["value"]
    again, _ = run(env, 9)
    assert again["compiled"] == 0


def test_an_unreadable_entry_is_compiled_again_with_a_warning(tmp_path):
    env = environment(tmp_path)
    first, _ = run(env)
    owned = tmp_path / "cache" / "jax-compile"
    for entry in entries(owned):
        entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])  # truncated
    second, err = run(env)
    assert "Error reading persistent compilation cache entry" in err
    assert second["value"] == first["value"] and second["from_cache"] == 0


def test_half_written_pairs_in_fastpops_directory_are_dropped(tmp_path):
    owned = tmp_path / "cache" / "jax-compile"
    owned.mkdir(parents=True)
    (owned / "abc-cache").write_bytes(b"x")  # its last-use time never written
    (owned / "def-atime").write_bytes(b"x")
    (owned / "keep.txt").write_bytes(b"x")
    run(environment(tmp_path))
    assert not (owned / "abc-cache").exists() and not (owned / "def-atime").exists()
    assert (owned / "keep.txt").exists()


def test_a_distributed_process_other_than_0_writes_what_it_compiled(tmp_path):
    """JAX writes the cache from process 0 alone; on a CPU the programs of the other processes
    are keyed by their own devices, so they would compile on every rerun and resume
    (fastpop/compilation/every_process_writes.py)."""
    owned = tmp_path / "cache" / "jax-compile"
    jax_alone, _ = run(environment(tmp_path, AS_PROCESS="1"))
    assert jax_alone["cache_writes"] == 0 and not entries(owned)
    env = environment(tmp_path, AS_PROCESS="1", EVERY_PROCESS_WRITES="1")
    first, _ = run(env)
    assert first["every_process_writes"] is True
    assert first["compiled"] == first["programs"] == first["cache_writes"] == len(entries(owned))
    second, _ = run(env)
    assert second["from_cache"] == second["programs"] and second["compiled"] == 0
    assert second["value"] == first["value"]

    # A user's own cache without a size limit has no lock to write under: JAX's rule stays.
    mine = tmp_path / "mine"
    env = environment(tmp_path, AS_PROCESS="1", EVERY_PROCESS_WRITES="1")
    user, _ = run(env | {"JAX_COMPILATION_CACHE_DIR": str(mine)})
    assert user["every_process_writes"] is False
    assert user["cache_writes"] == 0 and not entries(mine)


def test_on_a_gpu_process_0_alone_writes_as_jax_does(monkeypatch):
    """A GPU's cache keys leave the device ids out: process 0's entries serve every process, so
    the others keep JAX's rule (its own write, which skips them) instead of writing again."""
    import inspect
    from types import SimpleNamespace

    from jax._src import distributed

    from fastpop.compilation import every_process_writes

    given = []

    def jax_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
        given.append((module_name, backend.platform))

    write = every_process_writes._writing_from_every_process(
        jax_write, inspect.signature(jax_write)
    )
    monkeypatch.setattr(distributed.global_state, "process_id", 1)
    write("key", 5.0, "jit_update", SimpleNamespace(platform="gpu"), None, ())
    assert given == [("jit_update", "gpu")]
    monkeypatch.setattr(distributed.global_state, "process_id", 0)
    write("key", 5.0, "jit_update", SimpleNamespace(platform="cpu"), None, ())
    assert given == [("jit_update", "gpu"), ("jit_update", "cpu")]

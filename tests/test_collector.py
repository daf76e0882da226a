"""Collector processes: no JAX during the warm-up, and CPU-only JAX even when JAX was imported
before they could say so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.runs import with_this_checkout

# JAX imported before `force_cpu_jax` (by a test, or by whatever imports it first).
SCRIPT = """
import pickle, jax
from fastpop.collect.collector import force_cpu_jax
force_cpu_jax()
print(jax.config.jax_platforms, jax.default_backend())
"""


def test_force_cpu_jax_holds_when_jax_was_imported_first():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "definitely-not-a-platform"  # what a learner's setting could be
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=with_this_checkout(env),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "cpu"]


# A main script that imports JAX, as the `fastpop` console script does (it imports the command
# line): spawning would run it again in every collector unless Workers leaves it out.
WARM_UP = """
import json, sys, time
import jax

from fastpop import config as config_lib
from fastpop.collect.workers import Workers
from fastpop.config.build import build_env_spec, build_replay_spec

if __name__ == "__main__":
    import numpy as np

    config = config_lib.config_from_dict({
        "name": "warm-up", "algo": "td3", "env": {"id": "Pendulum-v1"},
        "population": {"size": 2},
        "collect": {"num_collectors": 1, "chunk_len": 4, "warmup_steps": 1_000_000},
    })
    replay_spec = build_replay_spec(config, build_env_spec(config))
    leaves = [np.zeros(3, np.float32), np.zeros((), np.int32)]  # never read in the warm-up
    with Workers(config, leaves, replay_spec, log=lambda *_: None) as workers:
        deadline = time.monotonic() + 120
        while (rows := workers.next_chunk()[0]) is None and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.01)
        stats = workers.stop()["collector 0"]
    print(json.dumps({"shape": list(rows.obs.shape), **stats}))
"""


def test_a_collector_in_its_warm_up_has_not_imported_jax(tmp_path):
    """Its first rows wait only for gymnasium: 16 collectors importing JAX (~1-2 s of CPU each)
    were most of the paper preset's start-up on 2 cores (results/startup/README.md). Neither
    what it is sent nor the parent's main script brings JAX in."""
    script = tmp_path / "train_script.py"
    script.write_text(WARM_UP)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=with_this_checkout(dict(os.environ)),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout.splitlines()[-1])
    assert stats["shape"] == [2, 4, 3] and stats["env_steps"] >= 2 * 4
    assert stats["jax_imported"] is False


def test_a_collectors_warm_up_ends_on_a_chunk_boundary():
    """Its last random chunk is sent before it builds its policy (importing JAX): the learner
    can start on a replay.min_size that the warm-up fills (1,000 of 32-row chunks: 1,024)."""
    import numpy as np

    from fastpop.collect.collector import whole_chunks
    from fastpop.collect.rollout import RowLayout

    rows = RowLayout(32, (3,), np.dtype(np.float32), np.dtype(np.float32), 1)
    assert [whole_chunks(steps, rows) for steps in (0, 1, 32, 1_000)] == [0, 32, 32, 1_024]

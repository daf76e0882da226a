"""Collector processes: no JAX during the warm-up, and CPU-only JAX even when JAX was imported
before they could say so."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "cpu"]


def test_a_collector_in_its_warm_up_has_not_imported_jax():
    """Its first rows wait only for gymnasium: 16 collectors importing JAX (~2 s of CPU each)
    were most of the paper preset's start-up on 2 cores (results/startup/README.md)."""
    import numpy as np

    from fastpop import config as config_lib
    from fastpop.collect.workers import Workers
    from fastpop.config.build import build_env_spec, build_replay_spec

    config = config_lib.config_from_dict(
        {
            "name": "warm-up",
            "algo": "td3",
            "env": {"id": "Pendulum-v1"},
            "population": {"size": 2},
            "collect": {"num_collectors": 1, "chunk_len": 4, "warmup_steps": 1_000_000},
        }
    )
    replay_spec = build_replay_spec(config, build_env_spec(config))
    leaves = [np.zeros(3, np.float32), np.zeros((), np.int32)]  # never read in the warm-up
    with Workers(config, leaves, replay_spec, log=lambda *_: None) as workers:
        deadline = time.monotonic() + 120
        while (rows := workers.next_chunk()[0]) is None and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.01)
        assert rows is not None and rows.obs.shape == (2, 4, 3)
        stats = workers.stop()
    assert stats["collector 0"]["jax_imported"] is False
    assert stats["collector 0"]["env_steps"] >= 2 * 4

"""Collector processes: CPU-only JAX even when JAX was imported before they could say so."""

from __future__ import annotations

import os
import subprocess
import sys

# Unpickling a CollectorSpec imports population/replay.py, hence JAX, before `run_collector` runs.
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

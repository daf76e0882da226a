"""XLA settings that fastpop's CPU performance depends on, applied before JAX starts.

Importing `fastpop` appends these to XLA_FLAGS unless the flag is already there, so a user's own
setting always wins, and a jaxlib older than a flag is not given it (XLA would abort);
FASTPOP_XLA_DEFAULTS=0 turns the defaults off. They only touch the CPU
backend. They must be in the environment before JAX initialises its backend: import fastpop
before running any JAX computation. Measurements: results/bench/README.md.

`RARELY_RUN` is not a flag but per-program compiler options, for any backend
(fastpop.compilation.rarely_run); `ENV_STEPPING` too, for device-env programs on the CPU.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

# name: (value, the first jaxlib whose XLA knows the flag). XLA aborts the process at start on
# a flag it does not know, so an older jaxlib is not given it (the name is in jaxlib 0.6.2's
# library and not 0.4.30's for the first flag, in 0.9.0's and not 0.8.0's for the second).
CPU_XLA_FLAGS = {
    # Without region analysis, copy insertion copies the population state around the scan's
    # while loop and TD3's delayed-actor conditional: 21.6 MiB per update at P=8 for TD3
    # (4.2 MiB with it). That memory-bound work grows with the population while the batched
    # matmuls stay fast, and is what made a naive jit(vmap) TD3 fall behind sequential.
    "xla_cpu_copy_insertion_use_region_analysis": ("true", (0, 6)),
    # XLA's YNNPACK dot fusions ran the 256-wide MLP updates slower than XLA's own dot emitter.
    "xla_cpu_experimental_ynn_fusion_type": ("", (0, 9)),
}

# Per-program compiler options (`jax.jit(..., compiler_options=...)`) for programs that run once
# or rarely, where the compile is what a run waits for: LLVM's O1 instead of O2. The members'
# init (TD3, brax pendulum preset, P = 4) compiled in 0.81-0.87 s against 1.50-1.61 s, and made
# bit-identical members; O0 was barely faster and not bit-identical.
RARELY_RUN = {"xla_backend_optimization_level": 1}

# Per-program compiler options for the programs that step device envs on the CPU (device mode's
# collect program and its evaluation; `env_stepping_options`): XLA's elemental IR emitters for
# loop fusions instead of its newer MLIR fusion emitters. The brax pendulum preset's chunk
# compiled in 11.2-11.5 CPU-s with them on its collect program against 13.8-15.2 (brax's step
# alone, 1.6 against 3.4 s), its env steps as fast; the MLP update ran ~10% slower with them,
# so only env-stepping programs take them (results/startup/README.md, "Env-stepping programs
# without XLA's fusion emitters").
ENV_STEPPING = {"xla_cpu_use_fusion_emitters": False}
ENV_STEPPING_SINCE = (0, 10)  # the jaxlib measured with; older ones keep XLA's default


def env_stepping_options() -> dict:
    """`ENV_STEPPING` on the CPU backend with jaxlib >= `ENV_STEPPING_SINCE`, else {} (the
    option is the CPU compiler's; an XLA that does not know it refuses the compile)."""
    import jax

    if jax.default_backend() != "cpu" or jaxlib_version()[:2] < ENV_STEPPING_SINCE:
        return {}
    return dict(ENV_STEPPING)


def jaxlib_version() -> tuple[int, ...]:
    """The installed jaxlib's (major, minor, patch), read without importing it; () if absent."""
    try:
        text = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def cpu_flags_for(version: tuple[int, ...]) -> dict[str, str]:
    """The `CPU_XLA_FLAGS` a jaxlib of `version` knows."""
    known = lambda since: bool(version) and version[:2] >= since
    return {name: value for name, (value, since) in CPU_XLA_FLAGS.items() if known(since)}


def apply_xla_defaults() -> None:
    if os.environ.get("FASTPOP_XLA_DEFAULTS", "1") == "0":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    missing = [
        f"--{name}={value}"
        for name, value in cpu_flags_for(jaxlib_version()).items()
        if f"--{name}" not in flags
    ]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([flags, *missing]).strip()

"""What the benchmarks share: a label and a description of the machine they run on, its host
memory, a learner built from a config without any worker process, the best of repeated timings,
and how results are written (JSON, two-panel PNG)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from fastpop.agents import registry

AUTO = "auto"  # DeviceBenchSettings.process_env: the device env's gymnasium counterpart


class DeviceBenchSettings(NamedTuple):
    """What `fastpop bench device` trains at every (P, E) it measures (bench/device.py), and
    the process-mode training beside it (bench/process_mode.py)."""

    env_id: str  # brax/<name>, gymnax/<name>, playground/<Name>
    backend: str | None = None  # brax's pipeline; None: the env's default (gymnax: None)
    algo: str = registry.DEFAULT
    seconds: float = 6.0  # per measurement, over all its rounds
    chunk_len: int = 32
    updates_per_call: int | None = None  # None: chunk_len
    agent: dict | None = None  # the agent section (hidden_sizes; None: the algo's defaults)
    process_env: str | None = AUTO  # gymnasium id trained in process mode; None: none


def device_label() -> str:
    """'cpu', or the accelerator's kind as a file-name-safe word (e.g. 'nvidia-h100-80gb-hbm3')."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-")


def build_learner(config):
    """The config's `Learner` (member states, replay; no collectors, no evaluator). A ConfigError
    names what cannot be built, as `fastpop train` would, before the replay is allocated."""
    from fastpop.run import parts

    learner = parts.build_learner(config)
    learner.config = config  # what the benchmarks report they measured
    return learner


def machine_description() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "memory_bytes": total_memory_bytes(),
    }


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def total_memory_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def available_host_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _memory_status() -> dict[str, int]:
    """Resident memory now (VmRSS) and its peak (VmHWM) in bytes, from /proc (Linux)."""
    sizes = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            sizes[name] = int(value.split()[0]) * 1024  # kB
    return sizes


class HostMemory:
    """The process's resident memory from now on: its peak, and the peak above now (Linux: the
    kernel's high-water mark, reset through /proc/self/clear_refs); None elsewhere."""

    def __init__(self):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak to the current
            self.start = _memory_status()["VmRSS"]
        except (OSError, KeyError):
            self.start = None

    def peak(self) -> int | None:
        return None if self.start is None else _memory_status()["VmHWM"]

    def peak_above_start(self) -> int | None:
        return None if self.start is None else _memory_status()["VmHWM"] - self.start


def best_seconds(call: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `call`, which waits for its result, after one
    untimed call (its compile)."""
    call()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


FLAT_RATIO = 1.15  # the slowest timed round over the fastest: at most this, or not flat


def round_flatness(rounds: list[float]) -> dict:
    """Whether a row's timed rounds (seconds per call, alternating with the other rows) agree:
    the per-step time flat across rounds, the steady state the median stands for."""
    ratio = max(rounds) / min(rounds)
    return {"rounds_ratio": ratio, "rounds_flat": ratio <= FLAT_RATIO}


def running_update(executor, states, replay, hparams) -> Callable[[object], None]:
    """An executor's update call as training makes it, on copies of a row's trees adopted
    once: `call(key)` runs one update call, carries its states on (a donated state is not
    reused) and waits for them."""
    import jax

    from fastpop import population

    run = [executor.adopt(tree) for tree in (population.copy_tree(states), replay, hparams)]

    def call(key) -> None:
        run[0], _ = executor.update(*run, key)
        jax.block_until_ready(run[0])

    return call


def write_json(result: dict, path: Path) -> Path:
    """A benchmark's result as indented JSON (numpy scalars as floats), its folder made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=float) + "\n")
    return path


def two_panel_figure(width: float):
    """(figure, (left axes, right axes)) side by side, 4 inches high, drawn without pyplot's
    global state, as fastpop's other plots are."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, 4))
    FigureCanvasAgg(figure)
    return figure, figure.subplots(1, 2)

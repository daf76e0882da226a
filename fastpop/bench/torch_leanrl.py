"""`fastpop bench update`'s LeanRL-class PyTorch rows (torch_compiled.py): `torch-leanrl` (TF32
matmuls, as JAX's default precision on a GPU) and `torch-leanrl-fp32` (TF32 off); on a CPU
both are float32, as JAX is there.

The rows at one population size are timed as the JAX rows are (update.py's `time_executors`):
each call K updates and one synchronize; warm-up calls (compiling, capturing the CUDA graphs)
apart, reported as compile seconds; alternating rounds, the median call. At P = 1 the rows are
one LeanRL-style agent, not vmapped (`single_agent`). A row that fails to compile, capture or run
says so in its fields and the sweep goes on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from fastpop.bench.common import round_flatness
from fastpop.bench.torch_baseline import default_buffer_size, make_agents
from fastpop.bench.torch_compiled import LEAN_AGENTS, KStepCall
from fastpop.bench.torch_variants import StackedReplay, require_cpp_compiler

# name -> TF32 matmuls, on a GPU (on a CPU both rows are float32: `matmul_precision`)
TF32 = {"torch-leanrl": True, "torch-leanrl-fp32": False}
WARMUP_CALLS = 3  # the first compiles (TD3: its actor step on the first call with K >= 2)


def check_algorithm(algo: str) -> None:
    """ValueError unless the LeanRL rows have `algo`."""
    if algo not in LEAN_AGENTS:
        raise ValueError(
            f"the torch-leanrl rows have no {algo!r}: choose from {', '.join(LEAN_AGENTS)} "
            f"(or, for {algo}, the torch, torch-compile and torch-func rows)"
        )


class RowOptions(NamedTuple):
    """What a row's update is: `fastpop bench update`'s settings that PyTorch's agents take."""

    algo: str
    updates_per_call: int
    batch_size: int | None = None  # None: the agents' default (256)
    hidden: int | None = None  # the MLPs' width; None: the agents' default (256)
    buffer_rows: int | None = None  # per member; None: torch_baseline's default
    seed: int = 0


def row_options(settings) -> RowOptions:
    """`update.UpdateBenchSettings` -> the rows' options (the agent's two equal hidden sizes,
    the replay's rows where the settings name them)."""
    check_algorithm(settings.algo)
    sizes = tuple((settings.agent or {}).get("hidden_sizes", ()))
    if sizes and (len(sizes) != 2 or sizes[0] != sizes[1]):
        raise ValueError(f"PyTorch's agents have two equal hidden layers, not {sizes}")
    return RowOptions(
        settings.algo,
        settings.updates_per_call,
        settings.batch_size,
        sizes[0] if sizes else None,
        getattr(settings, "replay_rows", None),
        settings.seed,
    )


@contextmanager
def matmul_precision(tf32: bool, device: torch.device) -> Iterator[None]:
    """On a GPU, float32 matmuls (and cuDNN's) in TF32 or not, the previous setting restored
    after; through the legacy API only (PyTorch >= 2.9 refuses to read the precision once it
    and the new `fp32_precision` API were mixed). On a CPU nothing: "high" there would turn on
    oneDNN's TF32 (emulated, many times slower), and JAX's CPU default is float32."""
    if device.type != "cuda":
        yield
        return
    try:
        previous = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # set through the new API: restore that
        previous = None
        matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
        new = (matmul.fp32_precision, conv.fp32_precision)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        if previous is not None:
            torch.set_float32_matmul_precision(previous[0])
            torch.backends.cudnn.allow_tf32 = previous[1]
        else:
            matmul.fp32_precision, conv.fp32_precision = new


def compile_step(fn: Callable) -> Callable:
    """LeanRL's compile: Inductor's default mode (the CUDA graphs are ours), shapes static."""
    return torch.compile(fn, dynamic=False)


def graph_breaks() -> int:
    """Dynamo's graph breaks so far in this process (0 where its counters moved)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return sum(counters["graph_break"].values())


class Prepared(NamedTuple):
    """A row compiled and warmed up: its call, the row's fields so far, its timed rounds."""

    call: KStepCall
    row: dict
    rounds: list[float]


def prepare(impl: str, options: RowOptions, size: int, device, compile_fn) -> Prepared:
    """`impl`'s update at population `size`: built, compiled, warmed up and (on CUDA) its
    graphs captured, under its matmul precision. Raises what went wrong but the capture."""
    tf32, single = TF32[impl], size == 1
    row = {"impl": impl, "population": size, "single_agent": single}
    row["tf32"] = tf32 and device.type == "cuda"
    with matmul_precision(tf32, device):
        seeds = range(options.seed, options.seed + size)
        agents = make_agents(options.algo, seeds, device, options.hidden, options.batch_size)
        rows = options.buffer_rows or default_buffer_size(options.algo, size)
        fields = StackedReplay(options.algo, rows, seeds, device).fields
        torch.manual_seed(options.seed)  # the steps' draws
        lean = LEAN_AGENTS[options.algo](agents, fields, single=single)
        del agents, fields
        hidden = next(iter(lean.state["critic"].values())).shape[-2]  # the first layer's
        row |= {"batch_size": lean.batch_size, "hidden": hidden, "buffer_rows": rows}
        call = KStepCall(lean, options.updates_per_call)
        breaks, start = graph_breaks(), time.perf_counter()
        lean.compile(compile_fn)
        call.warm_up(WARMUP_CALLS)
        row["cuda_graph"] = False
        if call.cuda:
            captured = time.perf_counter()
            row |= capture(call)
            row["capture_seconds"] = time.perf_counter() - captured
        row["graph_breaks"] = graph_breaks() - breaks
        row["warmup_seconds"] = time.perf_counter() - start
        row["warmup_calls"] = call.done // options.updates_per_call
    return Prepared(call, row, [])


def capture(call: KStepCall) -> dict:
    """The call's CUDA graphs captured: {"cuda_graph": True}, or False and why, the compiled
    steps then run without (still one synchronize per call)."""
    try:
        call.capture()
    except Exception as error:
        fields = {"cuda_graph": False, "cuda_graph_error": f"{type(error).__name__}: {error}"}
        call.warm_up(1)  # the steps still run without the graphs, or the row fails
        return fields
    return {"cuda_graph": True}


def time_rounds(prepared: dict[str, Prepared], min_seconds: float, rounds: int) -> dict:
    """Alternating rounds of each prepared row's calls, each at least `min_seconds / rounds`
    and 2 calls; {name: error text} of rows whose calls failed (left out of later rounds)."""
    failed = {}
    for _ in range(rounds):
        for name, (call, row, times) in prepared.items():
            if name in failed:
                continue
            try:
                with matmul_precision(row["tf32"], call.lean.device):
                    calls, start = 0, time.perf_counter()
                    while calls < 2 or time.perf_counter() - start < min_seconds / rounds:
                        call()
                        call.sync()
                        calls += 1
                    times.append((time.perf_counter() - start) / calls)
            except Exception as error:
                failed[name] = f"timing: {type(error).__name__}: {error}"
    return failed


def finished_row(prepared: Prepared, updates_per_call: int, flops: float) -> dict:
    """A timed row: rates as update.py's rows have them, the rounds and their flatness."""
    call, row, times = prepared
    seconds = statistics.median(times)
    rate = row["population"] * updates_per_call / seconds
    return row | {
        "agent_updates_per_s": rate,
        "seconds_per_call": seconds,
        "seconds_per_call_rounds": times,
        **round_flatness(times),
        "compile_seconds": max(row["warmup_seconds"] - row["warmup_calls"] * seconds, 0.0),
        "gflops_per_s": rate * flops / 1e9,
        "finite": call.lean.finite(),
    }


def leanrl_rows(
    settings,
    impls: list[str],
    size: int,
    flops: float,
    log=print,
    *,
    rounds: int,
    compile_fn: Callable | None = None,
) -> list[dict]:
    """The rows of `impls` (names of `TF32`) at population `size` with `settings`
    (update.UpdateBenchSettings'), timed together; a row that failed has "error" (and zero
    rates) and the others go on. `compile_fn`: torch.compile's call (None: `compile_step`)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    common = {
        "updates_per_call": settings.updates_per_call,
        "torch_version": torch.__version__,
        "torch_device": str(device),
    }
    prepared, errors = {}, {}
    for impl in impls:
        try:
            options = row_options(settings)
            require_cpp_compiler(device)
            compile_fn = compile_fn or compile_step
            prepared[impl] = prepare(impl, options, size, device, compile_fn)
        except Exception as error:
            errors[impl] = f"{type(error).__name__}: {error}"
    errors |= time_rounds(prepared, settings.min_seconds, rounds)
    rows = []
    for impl in impls:
        try:
            if impl in errors:
                raise RuntimeError(errors[impl])
            row = finished_row(prepared[impl], settings.updates_per_call, flops)
        except Exception as error:
            why = errors.get(impl) or f"{type(error).__name__}: {error}"
            row = error_row(impl, size, why, device)
        rows.append(common | row)
        log(row_line(settings.algo, rows[-1]))
    del prepared
    if device.type == "cuda":  # the graphs' pools and the buffers: back for the next rows
        torch.cuda.empty_cache()
    return rows


def error_row(impl: str, size: int, error: str, device: torch.device) -> dict:
    """A row that could not be timed: why, and zero rates (no speedup is taken against it)."""
    return {
        "impl": impl,
        "population": size,
        "tf32": TF32[impl] and device.type == "cuda",
        "single_agent": size == 1,
        "error": error,
        "agent_updates_per_s": 0.0,
        "seconds_per_call": None,
        "compile_seconds": 0.0,
        "gflops_per_s": 0.0,
        "cuda_graph": False,
    }


def row_line(algo: str, row: dict) -> str:
    """A row as the console shows it."""
    name = f"{algo} {row['impl']:10s} P={row['population']:3d}"
    if "error" in row:
        return f"{name}  failed: {row['error']}"
    graph = "CUDA graph" if row["cuda_graph"] else "no CUDA graph"
    if "cuda_graph_error" in row:
        graph += f" ({row['cuda_graph_error']})"
    flat = "" if row["rounds_flat"] else f"  rounds not flat ({row['rounds_ratio']:.2f}x)"
    return (
        f"{name}  {row['agent_updates_per_s']:9.1f} agent-updates/s  "
        f"{row['gflops_per_s']:7.1f} GFLOP/s  compile {row['compile_seconds']:.1f} s  "
        f"{graph}{'  one agent' if row['single_agent'] else ''}{flat}"
    )

"""`torch_update_benchmark(..., variant=...)`: torch_baseline.py's sequential loop ("eager")
and the two ways a PyTorch user would make it fast: the paper's baseline should be the best
PyTorch the user could have written, not only the plainest.

"compile": each member's `update` under `torch.compile` (mode "reduce-overhead" on a GPU, which
replays CUDA graphs; Inductor's default on the CPU), members still updated one after another.
"func": the population's parameters stacked on a leading axis and every member's update computed
by one `torch.vmap`-ped call per step (torch_func.py), sampling every member's buffer at once.
"""

from __future__ import annotations

import time
import types

import torch

from fastpop.bench import torch_func
from fastpop.bench.torch_baseline import (
    AGENT_FACTORIES,
    ALGOS,
    VARIANTS,
    Batch,
    ReplayBuffer,
    default_buffer_size,
    eager_population_step,
    make_agents,
)

# Steps the compile variant runs before timing at least: Dynamo compiles the first call, TD3's
# first actor step (the second call), and recompiles once the step counter changes (the third);
# CUDA graph trees then record on a graph's second call and replay from its third.
COMPILE_WARMUP_STEPS = 6


def population_step(
    variant: str,
    algo: str,
    agents: list,
    buffer_size: int,
    seeds: range,
    warmup_steps: int,
    device: torch.device,
):
    """(`variant`'s population step, the warm-up steps to run before timing it)."""
    if variant == "compile":
        buffers = [ReplayBuffer(algo, buffer_size, seed, device) for seed in seeds]
        step = compiled_population_step(agents, buffers, device)
        return step, max(warmup_steps, COMPILE_WARMUP_STEPS)
    if variant == "func":
        population = torch_func.FUNC_AGENTS[algo](agents)
        replay = StackedReplay(algo, buffer_size, seeds, device)
        batch_size = agents[0].batch_size
        return (lambda: population.update(replay.sample(batch_size))), warmup_steps
    raise ValueError(f"unknown variant {variant!r}; expected compile or func")


def require_cpp_compiler(device: torch.device) -> None:
    """Inductor compiles CPU kernels with a C++ compiler: say so up front rather than deep in
    the first call. On a GPU it generates Triton kernels instead."""
    if device.type != "cpu":
        return
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
    except ImportError:  # a PyTorch that moved it: let the first call tell
        return
    try:
        get_cpp_compiler()
    except Exception as error:
        raise RuntimeError(
            "the torch.compile variant on the CPU needs a C++ compiler for Inductor (g++ or "
            "clang++ on PATH, or CXX naming one), and none was found: install one (e.g. "
            "apt-get install g++), or benchmark the eager or func variant"
        ) from error


def own_code(method: types.MethodType) -> types.MethodType:
    """`method` on a private copy of its function's code. Dynamo caches compiled frames per
    code object and guards each entry on the member's own modules and optimizers: shared code
    would hold all P members' entries, scan them on every call and hit Dynamo's recompile
    limit; a copy per member keeps each member's cache its own."""
    func = method.__func__
    copy = types.FunctionType(
        func.__code__.replace(),
        func.__globals__,
        func.__name__,
        func.__defaults__,
        func.__closure__,
    )
    return types.MethodType(copy, method.__self__)


def compiled_population_step(agents: list, buffers: list[ReplayBuffer], device: torch.device):
    """Each member's eager update, compiled; members updated one after another as eager's."""
    require_cpp_compiler(device)
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    updates = [torch.compile(own_code(agent.update), mode=mode) for agent in agents]
    # Frames every member shares (the optimizers' step) keep one entry per member: room for all,
    # and an error rather than a silent fall back to eager past it.
    limit = 8 * len(agents) + 64
    wanted = {
        "recompile_limit": limit,
        "accumulated_recompile_limit": limit,
        "fail_on_recompile_limit_hit": True,
    }  # (names of PyTorch >= 2.7; an older one keeps its defaults)
    patch = torch._dynamo.config.patch(
        {k: v for k, v in wanted.items() if hasattr(torch._dynamo.config, k)}
    )
    cuda = device.type == "cuda"

    @patch
    def step() -> None:
        for update, agent, buffer in zip(updates, agents, buffers, strict=True):
            if cuda:  # each member's update is a step of its own for CUDA graph trees
                torch.compiler.cudagraph_mark_step_begin()
            update(buffer.sample(agent.batch_size))

    return step


class StackedReplay:
    """Every member's buffer (the eager variant's, seed for seed) in one tensor per field, the
    population axis first: one gather samples every member's batch."""

    def __init__(self, algo: str, size: int, seeds: range, device: torch.device):
        self.fields: list[torch.Tensor] = []
        for i, seed in enumerate(seeds):  # one member's buffer at a time: memory for P + 1
            buffer = ReplayBuffer(algo, size, seed, device)
            fields = [getattr(buffer, name) for name in Batch._fields]
            if i == 0:
                self.fields = [field.new_empty((len(seeds), *field.shape)) for field in fields]
            for stacked, field in zip(self.fields, fields, strict=True):
                stacked[i] = field
        self.generator = torch.Generator(device).manual_seed(seeds[0])
        self.rows = torch.arange(len(seeds), device=device)[:, None]
        self.size, self.device = size, device

    def sample(self, batch_size: int) -> Batch:
        """A (P, batch_size, ...) batch: member i's rows drawn from member i's buffer."""
        shape = (len(self.rows), batch_size)
        idx = torch.randint(0, self.size, shape, generator=self.generator, device=self.device)
        return Batch(*(field[self.rows, idx] for field in self.fields))


def torch_update_benchmark(
    algo: str,
    population_size: int,
    num_steps: int,
    warmup_steps: int = 3,
    seed: int = 0,
    buffer_size: int | None = None,
    variant: str = "eager",
    hidden: int | None = None,
    batch_size: int | None = None,
) -> dict:
    """Time `num_steps` population steps of `variant`. "eager": a Python loop of one sample +
    update per agent; "compile" and "func": `population_step` (which may warm up longer)."""
    if algo not in AGENT_FACTORIES:
        raise ValueError(f"unknown algo {algo!r}; expected one of {', '.join(ALGOS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {', '.join(VARIANTS)}")
    if population_size < 1 or num_steps < 1 or warmup_steps < 0:
        raise ValueError("population_size and num_steps must be >= 1, warmup_steps >= 0")
    if buffer_size is None:
        buffer_size = default_buffer_size(algo, population_size)
    # Placed explicitly (not under `with device:`, a torch-function mode that adds Python work
    # to every operation and would slow the baseline down).
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seeds = range(seed, seed + population_size)
    agents = make_agents(algo, seeds, device, hidden, batch_size)
    if variant == "eager":
        step = eager_population_step(
            agents, [ReplayBuffer(algo, buffer_size, s, device) for s in seeds]
        )
    else:
        step, warmup_steps = population_step(
            variant, algo, agents, buffer_size, seeds, warmup_steps, device
        )

    def timed_step() -> None:
        step()
        if device.type == "cuda":  # kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize()

    start = time.perf_counter()
    for _ in range(warmup_steps):
        timed_step()
    warmup_seconds = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(num_steps):
        timed_step()
    seconds_per_step = (time.perf_counter() - start) / num_steps
    # compile: the warm-up's time beyond steady steps (compiling, recording CUDA graphs)
    compile_seconds = max(0.0, warmup_seconds - warmup_steps * seconds_per_step)
    return {
        "variant": variant,
        "seconds_per_step": seconds_per_step,
        "agent_updates_per_s": population_size / seconds_per_step,
        "warmup_steps": warmup_steps,
        "warmup_seconds": warmup_seconds,
        "compile_seconds": compile_seconds if variant == "compile" else 0.0,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "buffer_size": buffer_size,
    }

"""Update-step benchmark: the paper's Figure 2 (population-wide update speed) on fastpop.

Each implementation performs the same TD3 / SAC / DQN update for every member of a
population, on random data of the paper's shapes held in a device replay buffer:
  vectorized                 one jit(vmap(scan)) program for the whole population
  vectorized+LEVER           the same with a lever of levers.py turned on
  sequential                 the single-member jitted program called per member from Python
  sequential-in-one-program  every member's K updates in one program, members in turn
  torch, torch-compile, torch-func   PyTorch: eager (the paper's baseline), compiled, vmapped
  torch-leanrl[-fp32]        PyTorch as LeanRL writes it: compiled, CUDA graphs, TF32 (or not)
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.agents import Agent, make_agent
from fastpop.agents.mlp_kernels import PALLAS_TILES
from fastpop.bench import anatomy, floors, kernel_times, levers
from fastpop.bench.common import device_label, round_flatness, running_update
from fastpop.bench.floors import matmul_gflops, update_cost
from fastpop.bench.random_replay import BENCH_SPECS, random_replay
from fastpop.bench.update_report import row_lines
from fastpop.population import replay

ROUNDS = 3  # timed rounds per measurement, alternating between implementations


def time_executors(
    executors: dict[str, population.Executor],
    states: dict,
    buffers,
    hparams,
    min_seconds: float,
    may_fail: Collection[str] = (),
) -> dict[str, dict]:
    """Per implementation: compile time and the median steady-state seconds per call.

    The implementations are timed in alternating rounds, so a burst of load on a noisy machine
    hits all of them instead of skewing one ratio. The process's CPU seconds per call are
    recorded too: on a machine shared with other load they compare the implementations' work
    where wall-clock time mostly measures the other load. An implementation of `may_fail` (a
    lever) whose first call raises is timed no further: its entry is {"error": what it raised}.
    """
    calls_of, timings, failed = {}, {}, {}
    for name, executor in executors.items():
        call = running_update(executor, states[name], buffers, hparams)
        start = time.perf_counter()
        try:
            call(jax.random.key(0))
        except Exception as error:  # e.g. a Pallas kernel Triton cannot fit on this GPU
            if name not in may_fail:
                raise
            failed[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
            continue
        calls_of[name] = call
        timings[name] = {"first_call": time.perf_counter() - start, "rounds": [], "calls": 0}
        timings[name]["cpu_rounds"] = []
    for round_index in range(ROUNDS):
        for name, call in calls_of.items():
            calls = 0
            start, cpu_start = time.perf_counter(), time.process_time()
            while calls < 2 or time.perf_counter() - start < min_seconds / ROUNDS:
                call(jax.random.key(1000 * round_index + calls))
                calls += 1
            timings[name]["rounds"].append((time.perf_counter() - start) / calls)
            timings[name]["cpu_rounds"].append((time.process_time() - cpu_start) / calls)
            timings[name]["calls"] += calls
    results = {}
    for name, timing in timings.items():
        seconds_per_call = float(np.median(timing["rounds"]))
        results[name] = {
            "seconds_per_call": seconds_per_call,
            "seconds_per_call_rounds": timing["rounds"],
            "cpu_seconds_per_call": float(np.median(timing["cpu_rounds"])),
            "compile_seconds": max(timing["first_call"] - seconds_per_call, 0.0),
            "calls": timing["calls"],
        }
    return results | failed


class UpdateBenchSettings(NamedTuple):
    """What `fastpop bench update` times at every population size and implementation."""

    algo: str  # a registered algorithm, on `BENCH_SPECS`' shapes (by its action kind)
    updates_per_call: int = 10
    batch_size: int | None = None  # None: the agent's default
    min_seconds: float = 2.0  # per implementation and population size, over all rounds
    seed: int = 0
    matmul_size: int | None = None  # of the reference matmul; None: `matmul_gflops`' default
    agent: dict | None = None  # more of the agent's config fields (hidden_sizes, ...)
    anatomy_from: int | None = None  # vectorized rows from this P get fastpop.bench.anatomy's
    memory_megabytes: float | None = None  # of the bandwidth measurement; None: its default
    kernel_times: bool = False  # those rows also get fastpop.bench.kernel_times' trace
    replay_rows: int | None = None  # per member (a run's replay.capacity); None: BENCH_REPLAY_ROWS


class Setup(NamedTuple):
    """One JAX implementation at the benchmark's shapes: its executor, plan and agent, and one
    member update's [FLOPs, bytes] from XLA's cost analysis."""

    executor: population.Executor
    plan: population.UpdatePlan
    agent: Agent
    cost: tuple[float, float]
    state_bytes: float  # parameter-state bytes of one member's update (bench/floors.py)
    compute_dtype: str


def make_setups(settings, implementations, spec, buffers) -> dict[str, Setup]:
    """A `Setup` per JAX implementation (its levers' agent and plan)."""
    setups, costs, state_bytes = {}, {}, {}
    for impl in implementations:
        config = dict(settings.agent or {}) | impl.agent
        if settings.batch_size is not None:
            config["batch_size"] = settings.batch_size
        agent = make_agent(settings.algo, BENCH_SPECS[settings.algo], **config)
        executor, plan = make_executor(impl, agent, spec, settings.updates_per_call)
        # Implementations of one computation (every executor, a plan lever, a kernel lever) cost
        # the same; XLA counts nothing inside a Pallas kernel, so XLA's kernels are counted.
        counted = {k: v for k, v in config.items() if k not in levers.SAME_COST_FIELDS}
        agent_key = tuple(sorted((name, repr(value)) for name, value in counted.items()))
        if agent_key not in costs:
            sample = jax.jit(plan.sample_batch)
            batch = sample(population.member(buffers, 0), jax.random.key(0))
            hparams = agent.default_hparams()
            counted_agent = make_agent(settings.algo, BENCH_SPECS[settings.algo], **counted)
            costs[agent_key] = tuple(map(float, update_cost(counted_agent, hparams, batch)))
            state_bytes[agent_key] = floors.state_bytes_per_update(agent, hparams)
        dtype = config.get("compute_dtype", "float32")
        setups[impl.name] = Setup(
            executor, plan, agent, costs[agent_key], state_bytes[agent_key], dtype
        )
    return setups


def bench_update(
    settings: UpdateBenchSettings,
    populations: Sequence[int],
    implementations: Sequence[str],
    log=print,
    on_row=None,
) -> dict:
    """Agent-updates/s per implementation (`levers.parse`'s names) and population size, plus
    FLOP accounting and, for vectorized rows, what bounds them (`anatomy`).
    `on_row(rows)`: called with the rows so far after each population size (a caller under a
    time cap keeps them)."""
    algo, updates_per_call = settings.algo, settings.updates_per_call
    impls = [levers.parse(name) for name in implementations]
    torch_impls = [i.base for i in impls if i.base in levers.TORCH_IMPLEMENTATIONS]
    levers.check_torch_rows(algo, torch_impls)
    torch_bench = levers.torch_benchmark(log) if torch_impls else None
    jax_impls = [i for i in impls if i.base in levers.JAX_IMPLEMENTATIONS]
    # The rates the floors need, measured first: a sweep cut short keeps its rows' floors.
    anatomy_from = settings.anatomy_from or 1
    rates = floor_rates(settings, jax_impls, max(populations) >= anatomy_from)
    setups, rows, failed = None, [], {}
    for size in populations:
        key = jax.random.key(settings.seed + size)
        spec, buffers = random_replay(algo, size, key, settings.replay_rows)
        if setups is None:  # the replay's layout is the same at every population size
            setups = make_setups(settings, jax_impls, spec, buffers)
        # Levers change an agent's static config, never its HParams: every setup's are the same.
        first = next(iter(setups.values()), None)
        hparams = first and population.broadcast_hparams(first.agent.default_hparams(), size)
        states = {
            name: population.init_population(setup.agent, key, hparams)
            for name, setup in setups.items()
        }
        executors = {name: setup.executor for name, setup in setups.items()}
        levered = [impl.name for impl in jax_impls if impl.name != impl.base]
        timings = time_executors(
            executors, states, buffers, hparams, settings.min_seconds, may_fail=levered
        )
        for impl in jax_impls:
            if "error" in timings[impl.name]:  # kept apart: every row has a rate
                failed.setdefault(impl.name, {})[size] = timings[impl.name]["error"]
                log(f"{algo} {impl.name} P={size}: failed, {timings[impl.name]['error'][:300]}")
                continue
            row = jax_row(settings, impl, setups[impl.name], timings[impl.name], size)
            if impl.base == "vectorized" and size >= anatomy_from:
                setup = setups[impl.name]
                row = what_bounds(settings, setup, row, rates, states[impl.name], buffers, hparams)
            rows.append(row)
            for line in row_lines(algo, row, updates_per_call):
                log(line)
        del buffers, states
        flops = next(iter(setups.values())).cost[0] if setups else float("nan")
        if torch_bench is not None:
            rows += levers.torch_rows(torch_bench, settings, torch_impls, size, flops, log, ROUNDS)
        if on_row is not None:
            levers.add_speedups(rows)  # the ratios so far: a capped sweep keeps them
            on_row(list(rows))
    levers.add_speedups(rows)
    return update_result(settings, setups, rates, rows) | {"failed": failed}


def floor_rates(settings: UpdateBenchSettings, jax_impls, anatomy_rows: bool) -> dict:
    """The machine's rates the rows' floors are judged by: the matmul rate, and where vectorized
    rows get their anatomy (`anatomy_rows`), the memory bandwidth (and bfloat16's matmul rate
    where an implementation computes in it)."""
    rates = {"matmul_gflops_per_s": matmul_gflops(settings.matmul_size)}
    if any(i.base == "vectorized" for i in jax_impls) and anatomy_rows:
        rates["memory_gbps"] = anatomy.memory_gbps(settings.memory_megabytes)
        if any(i.agent.get("compute_dtype") == "bfloat16" for i in jax_impls):
            rates["matmul_gflops_per_s_bfloat16"] = matmul_gflops(
                settings.matmul_size, dtype=jnp.bfloat16
            )
    return rates


def update_result(settings: UpdateBenchSettings, setups, rates: dict, rows: list) -> dict:
    """The benchmark's record: its shapes, the machine's rates and every row."""
    algo = settings.algo
    base = next(iter(setups.values())) if setups else None
    return {
        "algo": algo,
        "device": device_label(),
        "jax_version": jax.__version__,
        "shapes": {
            "obs": list(BENCH_SPECS[algo].obs_shape),
            "batch_size": base.agent.batch_size if base else None,
            "actions": BENCH_SPECS[algo].num_actions or BENCH_SPECS[algo].action_dim,
        },
        "agent_overrides": dict(settings.agent or {}),
        "updates_per_call": settings.updates_per_call,
        "flops_per_update": base.cost[0] if base else None,
        "bytes_per_update": base.cost[1] if base else None,
        **rates,
        "rows": rows,
    }


def what_bounds(settings, setup: Setup, row: dict, rates: dict, states, replay, hparams) -> dict:
    """A vectorized row's anatomy and floors (`anatomy`), and with `settings.kernel_times` its
    calls' kernels as the profiler saw them (`kernel_times`)."""
    steps = settings.updates_per_call
    per_program = row["seconds_per_call"] * setup.plan.num_updates / steps
    taken = branch_fraction(setup.agent)
    plan, update = setup.plan, setup.executor.update
    row = row | anatomy.read_safely(plan, update, states, replay, hparams, per_program, taken)
    floors.add_floors([row], rates, steps)
    if settings.kernel_times:
        row |= kernel_times.executor_kernel_times(setup.executor, states, replay, hparams)
    return row


def jax_row(settings, impl, setup: Setup, timing: dict, size: int) -> dict:
    """A JAX implementation's row at population `size`."""
    rate = size * settings.updates_per_call / timing["seconds_per_call"]
    flops, bytes_accessed = setup.cost
    return {
        "impl": impl.name,
        "population": size,
        "agent_updates_per_s": rate,
        **timing,
        **round_flatness(timing["seconds_per_call_rounds"]),
        "gflops_per_s": rate * flops / 1e9,
        "flops_per_update": flops,
        "bytes_per_update": bytes_accessed,
        "state_bytes_per_update": setup.state_bytes,
        "compute_dtype": setup.compute_dtype,
        **members_per_chunk(setup.executor, size),
        **pallas_tiles((settings.agent or {}) | impl.agent),
    }


def pallas_tiles(agent_config: dict) -> dict:
    """The Pallas MLP kernels' tiling [rows, chunk, warps], for rows computed with them."""
    if agent_config.get("mlp_kernel") != "pallas":
        return {}
    return {"pallas_tiles": list(agent_config.get("mlp_kernel_tiles") or PALLAS_TILES)}


def branch_fraction(agent: Agent) -> float | None:
    """The fraction of update steps that take the update's conditional branch (TD3's delayed
    actor step: 1 / policy_delay), for counting its kernels as they run; None: no such branch
    (`UpdateAnatomy.branch_fraction`)."""
    return floors.update_anatomy(agent, agent.default_hparams()).branch_fraction


def members_per_chunk(executor: population.Executor, size: int) -> dict:
    """How a CPU-tuned vectorized executor split population `size` (compile time then includes
    its measurement), else nothing."""
    chosen, how = getattr(executor.update, "chosen", {}), getattr(executor.update, "how", {})
    if size not in chosen:
        return {}
    return {"members_per_chunk": chosen[size], "how_chunked": how[size]}


def make_executor(
    impl: levers.Implementation, agent: Agent, spec: replay.ReplaySpec, updates_per_call: int
) -> tuple[population.Executor, population.UpdatePlan]:
    """The executor of `impl` sampling from `spec`'s buffers, and its plan (the updates of one
    program call)."""
    sample_batch = replay.Sampler(spec, agent.batch_size, agent.n_step)
    per_program = population.updates_per_program(spec.obs_shape, spec.obs_dtype, updates_per_call)
    plan = population.UpdatePlan(agent, sample_batch, per_program)._replace(**impl.plan)
    executor = population.make_executor(impl.base, plan)
    calls = updates_per_call // per_program
    return executor._replace(update=population.repeated(executor.update, calls)), plan

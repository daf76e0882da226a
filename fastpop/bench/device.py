"""Device-mode benchmark: environments stepped on the device (brax, gymnax, MuJoCo Playground)
while the population learns.

    fastpop bench device --env brax/<name>|gymnax/<name>|playground/<Name> --pop 1,4,16
        --envs-per-member 1,4 [--backend B (brax)] [--algo td3|sac|dqn] [--seconds S]

Per population size P and envs per member E, four measurements on JAX's default device, timed
in alternating rounds (a burst of load on a shared machine hits all four alike):

  fused    device-mode training as the run loop drives it: a Learner and a DeviceCollection,
           two compiled calls per chunk (rows and insert; the update calls they allow),
           samples_per_insert = batch size (one update per env step and member). A round stops
           the clock once every result is ready. No evaluations.
  collect  DeviceCollection.next_chunk alone: env step, autoreset, policy, rows; no learner.
  env      the ceiling: jit(scan(vmap(env.step))) of the P x E lanes over chunk_len steps.
  update   `fastpop bench update`'s measurement at these shapes: the vectorized executor on
           random rows of the env's sizes, the learner's agent (networks, batch), P and K.

  process  the same training in process mode (collector processes, rows copied to the device)
           on the env's gymnasium counterpart, e.g. HalfCheetah-v5 for brax/halfcheetah,
           CartPole-v1 for gymnax/CartPole-v1 (bench/process_mode.py), after the four;
           `--process-env none` leaves it out (MinAtar has no counterpart).

Compile seconds: a program's first call minus its second. Writes
results/bench/device_<env>_<device>.json and .png (device_report.py).
"""

from __future__ import annotations

import os
import time
from functools import partial

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop import population
from fastpop.bench.common import AUTO, DeviceBenchSettings, device_label, machine_description
from fastpop.bench.device_report import table_row
from fastpop.bench.process_mode import measure_process_mode, process_config
from fastpop.bench.random_replay import BENCH_REPLAY_ROWS, random_rows
from fastpop.collect import device_rollout
from fastpop.population import replay
from fastpop.xla_defaults import env_stepping_options

ROUNDS = 3  # timed rounds per measurement, the four measurements alternating
CAPACITY = 100_000  # replay transitions per member (the config default)


def bench_config(settings: DeviceBenchSettings, size: int, per_member: int) -> config_lib.Config:
    """The device-mode training config of one (P, E) measurement (`settings.updates_per_call`
    resolved)."""
    from fastpop.agents import make_agent
    from fastpop.envs.device_envs import device_env_spec

    env_id, backend, chunk_len = settings.env_id, settings.backend, settings.chunk_len
    agent = settings.agent or {}
    batch = make_agent(settings.algo, device_env_spec(env_id, backend), **agent).batch_size
    env = {"id": env_id} | ({} if backend is None else {"backend": backend})
    collect = {"mode": "device", "envs_per_member": per_member, "chunk_len": chunk_len}
    replay = {
        "capacity": CAPACITY - CAPACITY % per_member,
        "min_size": chunk_len * per_member,  # learning starts after the first chunk
        "samples_per_insert": float(batch),  # one update per env step and member
    }
    data = {"name": "bench_device", "algo": settings.algo, "env": env, "agent": agent}
    data |= {"replay": replay, "population": {"size": size}}
    data |= {"collect": collect | {"warmup_steps": 0}}
    data |= {
        "train": {"updates_per_call": settings.updates_per_call},
        "log": {"tensorboard": False},
    }
    return config_lib.config_from_dict(data)


def shapes(spec) -> dict:
    """obs: the vector's size or the grid's shape; actions: the action vector's size, or the
    number of discrete actions."""
    obs = spec.obs_shape[0] if len(spec.obs_shape) == 1 else list(spec.obs_shape)
    if spec.discrete:
        return {"obs": obs, "actions": spec.num_actions, "discrete": True}
    return {"obs": obs, "actions": spec.action_dim}


def timed(call) -> float:
    """Seconds of `call()` until its result is ready."""
    start = time.perf_counter()
    jax.block_until_ready(call())
    return time.perf_counter() - start


class Fused:
    """A Learner and a DeviceCollection driven as the run loop drives them: one compiled call
    per chunk that makes the rows, inserts them and runs the update calls they allow."""

    def __init__(self, config: config_lib.Config):
        from fastpop.learn.learner import Learner
        from fastpop.run.parts import build_run
        from fastpop.run.startup import make_collection

        start = time.perf_counter()
        self.parts = parts = build_run(config)
        self.learner = learner = Learner(parts.learner)
        self.collection = collection = make_collection(parts, learner)
        jax.block_until_ready((learner.states, collection.lanes))
        self.compile = {"build": time.perf_counter() - start}
        # The first call compiles the collect program and has no updates (learning starts after
        # its rows), the second compiles the update program: the third is the first of the
        # steady cycle.
        fused = [timed(self.feed) for _ in range(3)]
        chunk = [timed(self.collect) for _ in range(2)]
        self.compile["fused"] = max(fused[0] - fused[2], 0.0) + max(fused[1] - fused[2], 0.0)
        self.compile["rollout"] = max(chunk[0] - chunk[1], 0.0)
        self.compile["warm_up"] = time.perf_counter() - start

    def feed(self):
        self.collection.feed(self.learner)
        return self.learner.states, self.learner.replay.buffers, self.collection.lanes

    def round(self, seconds: float) -> dict:
        """Run-loop passes for at least `seconds`; the clock stops once the states, replay and
        env lanes are ready."""
        learner, limiter = self.learner, self.learner.limiter
        inserted, updates = limiter.inserted, learner.updates
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.collection.feed(learner)
        jax.block_until_ready(self.feed())  # one more pass, counted
        size = learner.size
        return {
            "seconds": time.perf_counter() - start,
            "env_steps": (limiter.inserted - inserted) * size,
            "agent_updates": (learner.updates - updates) * size,
        }

    def collect(self):
        """One chunk of rows, not inserted (the collection alone)."""
        learner = self.learner
        return self.collection.next_chunk(
            learner.states, learner.hparams, learner.member_env_steps
        )[0]

    def programs_compiled(self) -> dict:
        """Compiled variants of the per-chunk programs (1 each: no recompiles)."""
        programs = self.collection._programs
        return {
            "collect": programs.collect._cache_size(),
            "update": programs.update._cache_size(),
            "rollout": self.collection._chunk._cache_size(),
        }


class EnvAlone:
    """jit(scan(vmap(env.step))) of `lanes` envs over `steps` steps under random actions; the
    states carried from call to call (donated)."""

    def __init__(self, env, lanes: int, steps: int):
        shape = (steps, lanes) + (() if env.spec.discrete else (env.spec.action_dim,))

        def run(state, key):
            actions = device_rollout.random_actions(env.spec, key, shape)
            state = jax.lax.scan(lambda s, a: (jax.vmap(env.step)(s, a), None), state, actions)[0]
            return jax.tree.map(device_rollout.strongly_typed, state)

        self.run = jax.jit(run, donate_argnums=0, compiler_options=env_stepping_options())
        keys = jax.random.split(jax.random.key(0), lanes)
        # Strongly typed as run's output (gymnax's resets are weakly typed): one compile.
        reset = jax.jit(jax.vmap(env.reset))
        self.state = jax.tree.map(device_rollout.strongly_typed, reset(keys))
        self.key = jax.random.key(1)

    def __call__(self):
        self.key, key = jax.random.split(self.key)
        self.state = self.run(self.state, key)
        return self.state


class UpdateAlone:
    """`fastpop bench update`'s vectorized measurement at the env's shapes: `agent`'s
    update of every member, K per call, on random rows held in per-member device buffers."""

    def __init__(self, agent, env_spec, hparams, updates_per_call: int, seed: int = 0):
        size = population.population_size(hparams)
        key = jax.random.key(seed + size)
        rows = BENCH_REPLAY_ROWS[agent.name]  # random rows per member, as bench update's
        spec = replay.make_replay_spec(env_spec, rows, lanes=1, chunk_len=rows)
        chunks = jax.vmap(lambda k: random_rows(spec, env_spec, k))(jax.random.split(key, size))
        add = jax.jit(jax.vmap(partial(replay.add, spec)))
        buffers = add(replay.init_population(spec, size), chunks)
        sample_batch = replay.Sampler(spec, agent.batch_size, agent.n_step)
        plan = population.UpdatePlan(agent, sample_batch, updates_per_call)
        self.executor = population.make_executor("vectorized", plan)
        states = population.init_population(agent, key, hparams)
        self.run = [self.executor.adopt(tree) for tree in (states, buffers, hparams)]
        self.size, self.calls = size, 0

    def __call__(self):
        self.calls += 1
        self.run[0], _ = self.executor.update(*self.run, jax.random.key(self.calls))
        return self.run[0]

    def members_per_chunk(self) -> dict:
        """How the CPU-tuned executor split the population (as bench update reports it)."""
        update = self.executor.update
        chosen, how = getattr(update, "chosen", {}), getattr(update, "how", {})
        if self.size not in chosen:
            return {}
        return {"members_per_chunk": chosen[self.size], "how_chunked": how[self.size]}


def calls_round(call, seconds: float, block_each: bool) -> dict:
    """Calls for at least `seconds` (and twice); the clock stops once the last is ready."""
    calls, start = 0, time.perf_counter()
    while calls < 2 or time.perf_counter() - start < seconds:
        result = call()
        if block_each:  # as bench update times its calls
            jax.block_until_ready(result)
        calls += 1
    jax.block_until_ready(result)
    return {"seconds": time.perf_counter() - start, "calls": calls}


def measure(config: config_lib.Config, seconds: float, log, process=None) -> dict:
    """The four measurements of one (P, E), in alternating rounds; then, given `process` (a
    process-mode config), the same training in process mode (bench/process_mode.py)."""
    from fastpop.envs.device_envs import make_device_env

    size, per_member = config.population.size, config.collect.envs_per_member
    chunk_len, updates = config.collect.chunk_len, config.train.updates_per_call
    fused = Fused(config)
    learner = fused.learner
    env = make_device_env(config.env.id, config.env.backend)
    env_alone = EnvAlone(env, size * per_member, chunk_len)
    update_alone = UpdateAlone(
        learner.agent, fused.parts.learner.env_spec, learner.hparams, updates
    )
    compile_seconds = dict(fused.compile)
    for name, call in (("env", env_alone), ("update_alone", update_alone)):
        first, second = timed(call), timed(call)
        compile_seconds[name] = max(first - second, 0.0)
    rounds = {"fused": [], "collect": [], "env": [], "update": []}
    share = seconds / ROUNDS
    for _ in range(ROUNDS):
        rounds["fused"].append(fused.round(share))
        rounds["collect"].append(calls_round(fused.collect, share, block_each=False))
        rounds["env"].append(calls_round(env_alone, share, block_each=False))
        rounds["update"].append(calls_round(update_alone, share, block_each=True))
    lane_steps = size * per_member * chunk_len  # env steps of one chunk, all lanes
    row = {
        "population": size,
        "envs_per_member": per_member,
        "fused": rates(rounds["fused"]),
        "collect_alone": rates(rounds["collect"], env_steps=lane_steps),
        "env_alone": rates(rounds["env"], env_steps=lane_steps),
        "update_alone": rates(rounds["update"], agent_updates=size * updates)
        | update_alone.members_per_chunk(),
        "compile_seconds": compile_seconds,
        "programs_compiled": fused.programs_compiled(),
        "load_average_1min": os.getloadavg()[0],  # after the rounds
    }
    if process is not None:
        row["process_mode"] = measure_process_mode(process, ROUNDS, seconds, rates)
    row["ratios"] = ratios(row, chunk_len * per_member / updates)
    log(table_row(row))
    return row


def rates(rounds: list[dict], env_steps: int = 0, agent_updates: int = 0) -> dict:
    """Median env-steps/s and agent-updates/s over rounds (counts per call, or per round)."""
    result: dict = {"rounds": rounds}
    for name, per_call in (("env_steps", env_steps), ("agent_updates", agent_updates)):
        counts = [r.get(name, per_call * r.get("calls", 0)) for r in rounds]
        if any(counts):
            values = [count / r["seconds"] for count, r in zip(counts, rounds, strict=True)]
            result[f"{name}_per_s"] = float(np.median(values))
    if "calls" in rounds[0]:
        result["seconds_per_call"] = float(np.median([r["seconds"] / r["calls"] for r in rounds]))
    return result


def ratios(row: dict, calls_per_chunk: float) -> dict:
    """fused against its ceilings, and against the sum of its parts run one after the other
    (a chunk alone plus the chunk's update calls alone)."""
    fused, env, update = row["fused"], row["env_alone"], row["update_alone"]
    collect = row["collect_alone"]
    chunk_steps = collect["env_steps_per_s"] * collect["seconds_per_call"]
    serial = chunk_steps / (
        collect["seconds_per_call"] + calls_per_chunk * update["seconds_per_call"]
    )
    result = {
        "fused_env_steps_vs_env_alone": fused["env_steps_per_s"] / env["env_steps_per_s"],
        "collect_alone_vs_env_alone": collect["env_steps_per_s"] / env["env_steps_per_s"],
        "fused_updates_vs_update_alone": fused["agent_updates_per_s"]
        / update["agent_updates_per_s"],
        "fused_vs_serial_sum": fused["env_steps_per_s"] / serial,
        "updates_per_env_step": fused["agent_updates_per_s"] / fused["env_steps_per_s"],
    }
    if "process_mode" in row:
        process = row["process_mode"]["env_steps_per_s"]
        result["fused_env_steps_vs_process_mode"] = fused["env_steps_per_s"] / process
    return result


def bench_device(
    settings: DeviceBenchSettings,
    populations: list[int],
    per_member_values: list[int],
    command: str = "",
    log=print,
    on_row=None,
) -> dict:
    """Every (P, E) measured; the result as written to the JSON file. `settings.process_env`:
    the gymnasium id trained in process mode beside each row (AUTO: the env's gymnasium
    counterpart, where it has one; None: no process-mode rows). `on_row(rows)`, if given, is
    called with the rows so far after each (P, E)."""
    from fastpop.agents import make_agent
    from fastpop.envs import device_envs

    env_id = device_envs.check_device_id(settings.env_id)
    backend = device_envs.resolve_backend(env_id, settings.backend)
    process_env = settings.process_env
    if process_env == AUTO:
        process_env = device_envs.process_counterpart(env_id)
    updates_per_call = settings.updates_per_call or settings.chunk_len
    settings = settings._replace(
        env_id=env_id, backend=backend, updates_per_call=updates_per_call, process_env=process_env
    )
    agent = settings.agent or {}
    load_before, rows = os.getloadavg(), []
    for per_member in per_member_values:
        for size in populations:
            config = bench_config(settings, size, per_member)
            process = None
            if process_env is not None:
                process = process_config(settings, size, per_member)
            rows.append(measure(config, settings.seconds, log, process))
            if on_row is not None:
                on_row(rows)
    spec = device_envs.device_env_spec(env_id, backend)
    batch_size = make_agent(settings.algo, spec, **agent).batch_size
    return {
        "env": env_id,
        "backend": backend,
        "process_env": process_env,
        "algo": settings.algo,
        "device": device_label(),
        "jax_version": jax.__version__,
        "machine": machine_description(),
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
        "command": command,
        "shapes": shapes(spec),
        "agent": agent | {"batch_size": batch_size},
        "samples_per_insert": batch_size,
        "chunk_len": settings.chunk_len,
        "updates_per_call": updates_per_call,
        "seconds_per_measurement": settings.seconds,
        "rounds": ROUNDS,
        "rows": rows,
    }

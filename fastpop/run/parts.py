"""The one front door: a config becomes a run's parts here, each decided once.

    build_run(config) -> RunParts    env spec (and, device mode, the DeviceEnv), agent, replay
                                     spec, strategy, training, rate limiter, mesh, collection
                                     mode; refused (ConfigError) before any process or file
                                     exists

The learner, the collections and the run are made from the parts (`RunParts.learner_parts`,
`make_collection`): none of them reads the config's fields on its own or works the collection
mode out again. `fastpop.config.build` keeps the low-level builders that collector and evaluator
processes (which get the config, not the parts: agents do not cross the spawn boundary) use.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from fastpop import config as config_lib
from fastpop import population, strategies
from fastpop.agents import Agent
from fastpop.collect.device_collection import DeviceCollection, DeviceParts
from fastpop.collect.device_rollout import env_state_bytes as device_env_state_bytes
from fastpop.collect.segments import memory_order_problem
from fastpop.collect.sources import Collection, ProcessCollection
from fastpop.compilation import compile_cache
from fastpop.config.build import build_agent, build_env_spec, build_replay_spec
from fastpop.learn import update_protocol
from fastpop.learn.learner import Learner, LearnerParts
from fastpop.learn.rate_limiter import InProgramLimiter, RateLimiter
from fastpop.learn.replay_store import layout_for
from fastpop.machine import usable_cores
from fastpop.population import replay, sharding
from fastpop.run.checkpoint import CheckpointStore, LocalCheckpoints
from fastpop.run.stop_signals import StopSignals
from fastpop.strategies.base import Strategy
from fastpop.types import EnvSpec


class RunParts(NamedTuple):
    """Everything a run is made of. `config` is the record written with the run (config.yaml,
    checkpoints) and what collector processes rebuild their envs and agents from."""

    config: config_lib.Config
    collection_mode: str  # "processes" or "device", worked out here only
    env_spec: EnvSpec
    device_env: Any  # device mode: the DeviceEnv (brax, gymnax), built once; None in processes
    agent: Agent
    replay_spec: replay.ReplaySpec
    strategy: Strategy
    training: update_protocol.Training
    limiter: RateLimiter
    mesh: Any  # jax.sharding.Mesh over population.devices, or None: one device

    def learner_parts(self) -> LearnerParts:
        config = self.config
        return LearnerParts(
            self.agent,
            self.env_spec,
            self.replay_spec,
            layout_for(config.replay.shared, run_execution(config, self.env_spec, self.mesh)),
            config.population.size,
            self.strategy,
            self.training,
            self.limiter,
            self.mesh,
            initial_hparams(config, self.agent),
            config.seed,
            config.train.updates_per_call,
        )

    def device_parts(self) -> DeviceParts:
        config = self.config
        return DeviceParts(
            self.device_env,
            config.env.episode_length,
            config.collect,
            config.eval.episodes,
            config.population.size,
            config.seed,
            self.agent,
            self.env_spec,
            self.training,
            self.mesh,
            stored_identity(config),
        )


# Config fields no compiled program of a run reads (its length, its outputs, its name; the seed
# and the hparams enter programs as arguments): left out of the identity its stored programs
# are kept under, so that a rerun with another seed or length loads them.
# tests/test_stored_programs.py checks that programs exported under each differ in nothing.
NOT_IN_PROGRAMS = (
    "name", "seed", "hparams", "log", "checkpoint", "train.total_env_steps",
    "train.max_wall_seconds", "train.compile_cache", "eval.interval",
)  # fmt: skip


def program_identity(config: config_lib.Config) -> str:
    """The config as text, less NOT_IN_PROGRAMS (the `identity` of
    fastpop.compilation.stored_programs)."""
    fields = config_lib.config_to_dict(config)
    for dotted in NOT_IN_PROGRAMS:
        section, _, name = dotted.partition(".")
        (fields[section] if name else fields).pop(name or section, None)
    return json.dumps(fields, sort_keys=True)


def stored_identity(config: config_lib.Config) -> str | None:
    """`program_identity` where the run's device programs may be stored: on one device (on a
    mesh their placement decides them too); None elsewhere."""
    return program_identity(config) if sharding.device_count(config.population) == 1 else None


def build_run(config: config_lib.Config) -> RunParts:
    """A run's parts; everything that can refuse the config is checked here (ConfigError: the
    factories' own checks raise ValueError, which callers must not confuse with JAX's)."""
    try:
        return _build_run(config)
    except config_lib.ConfigError:
        raise
    except ValueError as error:  # an algorithm, env, strategy or prior refusing the config
        raise config_lib.ConfigError(str(error)) from error


def _build_run(config: config_lib.Config) -> RunParts:
    if not config.train.compile_cache:  # before anything compiles: JAX opens its cache once
        compile_cache.disable("train.compile_cache: false")
    mode, device_env = _collection(config)
    if mode == "processes" and (problem := memory_order_problem()) is not None:
        raise config_lib.ConfigError(f"{problem} (or step device envs with collect.mode: device)")
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    _check_memory(config, spec, device_env)
    sharding.device_count(config.population)  # enough devices, an even split
    replay_spec = build_replay_spec(config, spec)
    strategy = config_lib.build_strategy(config)
    mesh = sharding.mesh_for(config.population)
    sampler = replay.Sampler(replay_spec, agent.batch_size, agent.n_step)
    training = make_training(config, spec, agent, strategy, sampler, mesh)
    limiter = make_limiter(config, agent, mode)
    return RunParts(
        config, mode, spec, device_env, agent, replay_spec, strategy, training, limiter, mesh
    )


def build_learner(config: config_lib.Config, learner_class=Learner) -> Learner:
    """The config's learner alone (no collection): tests, benchmarks, `fastpop eval`."""
    return learner_class(build_run(config).learner_parts())


def make_collection(parts: RunParts, learner: Learner, log=print, device=None):
    """The parts' collection: collector processes, or envs stepped on the device (`device`: a
    DeviceCollection made before the learner, given its policy template here)."""
    if parts.collection_mode == "device":
        if device is None:
            return DeviceCollection(parts.device_parts(), learner.policy_template())
        device.set_policy_template(learner.policy_template())
        return device
    return process_collection(parts, log)


def process_collection(parts: RunParts, log=print) -> ProcessCollection:
    """Process mode's collection (its evaluator starts early where the strategy waits for it)."""
    waits = parts.strategy.waits_for_evaluation
    return ProcessCollection(parts.config, parts.replay_spec, log, waits)


class RunPieces(NamedTuple):
    """What a run on one process and a run on one of several (fastpop.distributed) differ in."""

    learner: Learner
    collection: Collection
    signals: StopSignals
    checkpoints: CheckpointStore


def local_pieces(
    parts: RunParts, checkpoint_dir: Path, log=print, collectors_ahead: bool = False
) -> RunPieces:
    """A run on this process alone: its learner, its collection, Ctrl-C and SIGTERM acted on at
    once, checkpoints in `checkpoint_dir` (<run>/checkpoints). `collectors_ahead`: a fresh run
    (never one to restore) whose collector processes start now, before the learner is made,
    unless they outnumber the cores."""
    # Device mode: the learner made in a thread while the chunk program is traced, then
    # compiled in one. Process mode, fresh: the collectors step their warm-up.
    device, ahead, learner_ahead = None, None, None
    learner_parts = parts.learner_parts()
    if parts.collection_mode == "device":
        device = DeviceCollection(parts.device_parts())
        learner_ahead = device.make_ahead(learner_parts)
    elif collectors_ahead and parts.config.collect.num_collectors <= usable_cores():
        # (more collectors than cores made the learner late: 16 on 2 cores put the paper
        # preset's first env step at 10-15 s against 8.5-9.3)
        ahead = process_collection(parts, log)
        ahead.start_ahead(parts.agent)
    learner = Learner(learner_parts) if learner_ahead is None else learner_ahead.result()
    collection = ahead or make_collection(parts, learner, log, device)  # processes or device
    checkpoints = LocalCheckpoints(checkpoint_dir, parts.config.checkpoint.keep)
    return RunPieces(learner, collection, StopSignals(), checkpoints)


def _collection(config: config_lib.Config) -> tuple[str, Any]:
    """The collection mode (`collect.mode`, resolved per env id) and, device mode, its env."""
    mode = config_lib.collection_mode(config)
    if mode != "device":
        return mode, None
    from fastpop.envs.device_envs import make_device_env

    return mode, make_device_env(config.env.id, config.env.backend)


def env_state_bytes(config: config_lib.Config, device_env=None) -> int:
    """Device bytes of the env states a run holds besides its replay: the P x E training lanes
    and the P x eval.episodes evaluation lanes of device mode (0 in process mode)."""
    if device_env is None:
        device_env = _collection(config)[1]
    if device_env is None:
        return 0
    size, per_member = config.population.size, config.collect.envs_per_member
    lanes = size * (per_member + config.eval.episodes)
    # Scaled from the training lanes' shapes: those of the program the run makes them with.
    return device_env_state_bytes(device_env, lanes, size * per_member, stored_identity(config))


def _check_memory(config: config_lib.Config, spec: EnvSpec, device_env) -> None:
    estimate = config_lib.memory_estimate(config, spec)
    if not estimate.fits:
        raise config_lib.ConfigError(estimate.message)
    # device mode: env states live beside the replay
    env_bytes = 0 if device_env is None else env_state_bytes(config, device_env)
    if estimate.bytes_needed + env_bytes > estimate.bytes_available:
        raise config_lib.ConfigError(
            f"{estimate.message}, and the device environments' states need "
            f"{env_bytes / 2**20:,.1f} MiB more: lower population.size or "
            "collect.envs_per_member"
        )


def initial_hparams(config: config_lib.Config, agent):
    """Stacked hparams of every member: the config's values and the strategy's overrides."""
    overrides = config_lib.member_overrides(config)
    return population.broadcast_hparams(
        config_lib.default_member_hparams(config, agent),
        config.population.size,
        **{name: [o[name] for o in overrides] for name in (overrides[0] if overrides else {})},
    )


def make_training(config: config_lib.Config, spec, agent, strategy, sample_batch, mesh=None):
    """The strategy's `Training` under the config's execution and replay layout, with its
    members split over `mesh` (population.devices > 1). Its update makes train.updates_per_call
    updates per member: in one program, or in calls of a shorter one
    (`population.updates_per_program`)."""
    updates = config.train.updates_per_call
    per_program = population.updates_per_program(spec.obs_shape, spec.obs_dtype, updates)
    # fresh trials (halving's) wait for replay.min_size rows in their emptied buffers
    fresh_trials = strategies.registry.get(config.strategy).fresh_trials
    fresh_wait = config.replay.min_size if fresh_trials else 0
    plan = population.UpdatePlan(agent, sample_batch, per_program, config.replay.shared, fresh_wait)
    execution = run_execution(config, spec, mesh)
    training = update_protocol.make_training(strategy, execution, plan, mesh)
    return training._replace(update=population.repeated(training.update, updates // per_program))


def run_execution(config: config_lib.Config, spec, mesh=None) -> str:
    """The executor a run's members are updated by: population.execution, except that an Atari
    agent on a CPU and one device is always updated member by member, as sequential execution
    does (`population.image_agent_on_cpu`: the same numbers, faster, compiled in seconds)."""
    if mesh is None and population.image_agent_on_cpu(spec.obs_shape, spec.obs_dtype):
        return "sequential"
    return config.population.execution


def make_limiter(config: config_lib.Config, agent, mode: str) -> RateLimiter:
    """Device mode keeps samples_per_insert exactly inside its programs per chunk; process
    mode lets collection and learning drift apart by the tolerance."""
    kind = InProgramLimiter if mode == "device" else RateLimiter
    return kind(
        config.replay.samples_per_insert,
        config.replay.min_size,
        config.replay.tolerance,
        samples_per_call=config.train.updates_per_call * agent.batch_size,
        insert_size=config.collect.chunk_len * config.collect.envs_per_member,
    )

"""The one front door: a config becomes a run's parts here, each made once.

    build_run(config) -> RunParts    collection mode, and what the learner (`LearnerParts`:
                                     env spec, agent, replay spec, strategy, training, rate
                                     limiter, mesh, hparams), device collection (`DeviceParts`:
                                     its DeviceEnv) or process collection (`ProcessParts`: its
                                     collect section, the collectors' envs, the recipe
                                     spawned processes rebuild their agent from) are made of;
                                     refused (ConfigError) before any process or file exists

The learner, the collections and the run are made from the parts (fastpop.run.startup): none
of them reads the config's fields on its own or works the collection mode out again. Collector
and evaluator processes get plain data (agents do not cross the spawn boundary): their
`ProcessParts.agent`, the `AgentRecipe` they rebuild their agent from, never the config.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from fastpop import config as config_lib
from fastpop import population, strategies
from fastpop.collect.collector import AgentRecipe, CollectorEnvs
from fastpop.collect.device_collection import DeviceParts
from fastpop.collect.device_rollout import env_state_bytes as device_env_state_bytes
from fastpop.collect.segments import memory_order_problem
from fastpop.collect.worker_processes import ProcessParts
from fastpop.compilation import compile_cache
from fastpop.config.build import build_agent, build_env_spec, build_replay_spec
from fastpop.config.plugins import plugin_sources
from fastpop.envs.device_envs import make_device_env
from fastpop.learn import update_protocol
from fastpop.learn.learner import Learner, LearnerParts
from fastpop.learn.rate_limiter import InProgramLimiter, RateLimiter
from fastpop.learn.replay_store import layout_for, make_layout
from fastpop.population import replay, sharding
from fastpop.run.trackers import check_trackers
from fastpop.types import EnvSpec


class RunParts(NamedTuple):
    """Everything a run is made of, each part made once. `config` is the record written with
    the run (config.yaml, checkpoints); `learner` what its learner is made of; `device` what
    device collection is made of (None in process mode); `processes` what process collection's
    workers are made of (None in device mode); `checkpoints_kept` how many complete checkpoints
    its checkpoint store keeps (checkpoint.keep)."""

    config: config_lib.Config
    learner: LearnerParts
    device: DeviceParts | None
    processes: ProcessParts | None
    checkpoints_kept: int

    @property
    def collection_mode(self) -> str:
        """The mode, "processes" or "device", as `build_run` worked it out: it makes `device`
        in device mode alone."""
        return "processes" if self.device is None else "device"


# Config fields no compiled program of a run reads (its length, its outputs, its name; the seed
# and the hparams enter programs as arguments): left out of the identity its stored programs
# are kept under, so that a rerun with another seed or length loads them.
# tests/test_stored_programs.py checks that programs exported under each differ in nothing.
NOT_IN_PROGRAMS = (
    "name",
    "seed",
    "hparams",
    "log",
    "checkpoint",
    "train.total_env_steps",
    "train.max_wall_seconds",
    "train.compile_cache",
    "eval.interval",
)


def program_identity(config: config_lib.Config) -> str:
    """The config as text, less NOT_IN_PROGRAMS, with its plugins' sources hashed (the
    `identity` of fastpop.compilation.stored_programs)."""
    fields = config_lib.config_to_dict(config)
    for dotted in NOT_IN_PROGRAMS:
        section, _, name = dotted.partition(".")
        (fields[section] if name else fields).pop(name or section, None)
    fields["plugin_sources"] = plugin_sources(config.plugins)  # their code decides programs too
    return json.dumps(fields, sort_keys=True)


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
    check_trackers(config.log)  # a missing wandb
    if not config.train.compile_cache:  # before anything compiles: JAX opens its cache once
        compile_cache.disable("train.compile_cache: false")
    mode = config_lib.collection_mode(config)
    if mode == "processes" and (problem := memory_order_problem()) is not None:
        raise config_lib.ConfigError(f"{problem} (or step device envs with collect.mode: device)")
    device_env = make_device_env(config.env.id, config.env.backend) if mode == "device" else None
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    replay_spec = build_replay_spec(config, spec)
    mesh = sharding.mesh_for(config.population)  # refuses too few devices, an uneven split
    # Device programs are kept on disk on one device only (on a mesh their placement decides
    # them too).
    identity = program_identity(config) if mesh is None else None
    _check_memory(config, spec, env_state_bytes(config, device_env, identity))
    strategy = config_lib.build_strategy(config)
    execution = run_execution(config, spec, mesh)
    layout = layout_for(config.replay.shared, execution)
    processes = process_parts(config, spec) if device_env is None else None
    sampler = replay.Sampler(replay_spec, agent.batch_size, agent.n_step)
    training = make_training(config, spec, agent, strategy, sampler, execution, mesh)
    kind = InProgramLimiter if mode == "device" else RateLimiter
    # Device mode keeps samples_per_insert exactly inside its programs per chunk; process mode
    # lets collection and learning drift apart by the tolerance.
    limiter = kind(
        config.replay.samples_per_insert,
        config.replay.min_size,
        config.replay.tolerance,
        samples_per_call=config.train.updates_per_call * agent.batch_size,
        insert_size=config.collect.chunk_len * config.collect.envs_per_member,
    )
    learner = LearnerParts(
        agent=agent,
        env_spec=spec,
        replay_layout=make_layout(replay_spec, layout, config.population.size, mesh),
        sampler=sampler,
        population_size=config.population.size,
        strategy=strategy,
        training=training,
        limiter=limiter,
        mesh=mesh,
        hparams=config_lib.initial_hparams(config, agent),
        seed=config.seed,
        updates_per_call=config.train.updates_per_call,
    )
    device = None
    if device_env is not None:
        device = DeviceParts(
            env=device_env,
            episode_length=config.env.episode_length,
            collect=config.collect,
            eval_episodes=config.eval.episodes,
            population_size=config.population.size,
            seed=config.seed,
            agent=agent,
            env_spec=spec,
            training=training,
            mesh=mesh,
            program_identity=identity,
        )
    return RunParts(config, learner, device, processes, config.checkpoint.keep)


def process_parts(config: config_lib.Config, spec: EnvSpec) -> ProcessParts:
    """What `config`'s collector and evaluator processes are made of, over its env spec `spec`
    (`build_run`'s; a distributed process's, over its own members' config:
    fastpop.distributed.multihost)."""
    collect = config.collect
    collector_envs = CollectorEnvs(
        config.env.id,
        config_lib.atari_options(config),
        collect.atari_vector,
        collect.num_collectors,
        collect.envs_per_member,
        collect.warmup_steps,
    )
    return ProcessParts(
        collect=collect,
        population_size=config.population.size,
        seed=config.seed,
        agent=AgentRecipe(config.algo, spec, dict(config.agent), tuple(config.plugins)),
        collector_envs=collector_envs,
        eval_episodes=config.eval.episodes,
    )


def config_policy_template(agent, config: config_lib.Config):
    """`collector.policy_template` of the hparams the learner of `config` starts with
    (`config.initial_hparams`), traced for their shapes only: for tests and benchmarks that
    start workers without a learner (a run's learner has its hparams)."""
    import jax

    from fastpop.collect.collector import policy_template

    hparams = jax.eval_shape(lambda: config_lib.initial_hparams(config, agent))
    return policy_template(agent, hparams)


def build_learner(config: config_lib.Config, learner_class=Learner) -> Learner:
    """The config's learner alone (no collection): tests, benchmarks, `fastpop eval`."""
    return learner_class(build_run(config).learner)


def env_state_bytes(config: config_lib.Config, device_env, identity: str | None) -> int:
    """Device bytes of the env states a run holds besides its replay: the P x E training lanes
    and the P x eval.episodes evaluation lanes of device mode (0 in process mode: no
    `device_env`), scaled from the training lanes' shapes: those of the program the run makes
    them with (kept on disk under `identity`, or not: None)."""
    if device_env is None:
        return 0
    size, per_member = config.population.size, config.collect.envs_per_member
    lanes = size * (per_member + config.eval.episodes)
    return device_env_state_bytes(device_env, lanes, size * per_member, identity)


def _check_memory(config: config_lib.Config, spec: EnvSpec, env_bytes: int) -> None:
    """The replay fits, and the device environments' states (`env_bytes`) beside it."""
    estimate = config_lib.memory_estimate(config, spec)
    if not estimate.fits:
        raise config_lib.ConfigError(estimate.message)
    if estimate.bytes_needed + env_bytes > estimate.bytes_available:
        raise config_lib.ConfigError(
            f"{estimate.message}, and the device environments' states need "
            f"{env_bytes / 2**20:,.1f} MiB more: lower population.size or "
            "collect.envs_per_member"
        )


def make_training(
    config: config_lib.Config, spec, agent, strategy, sample_batch, execution, mesh=None
):
    """The strategy's `Training` under `execution` (`run_execution`) and the config's replay
    layout, with its members split over `mesh` (population.devices > 1). Its update makes
    train.updates_per_call updates per member: in one program, or in calls of a shorter one
    (`population.updates_per_program`)."""
    updates = config.train.updates_per_call
    per_program = population.updates_per_program(spec.obs_shape, spec.obs_dtype, updates)
    # fresh trials (halving's) wait for replay.min_size rows in their emptied buffers
    fresh_trials = strategies.registry.get(config.strategy).fresh_trials
    fresh_wait = config.replay.min_size if fresh_trials else 0
    plan = population.UpdatePlan(agent, sample_batch, per_program, config.replay.shared, fresh_wait)
    training = update_protocol.make_training(strategy, execution, plan, mesh)
    return training._replace(update=population.repeated(training.update, updates // per_program))


def run_execution(config: config_lib.Config, spec, mesh=None) -> str:
    """The executor a run's members are updated by: population.execution, except that an Atari
    agent on a CPU and one device is always updated member by member, as sequential execution
    does (`population.image_agent_on_cpu`: the same numbers, faster, compiled in seconds)."""
    if mesh is None and population.image_agent_on_cpu(spec.obs_shape, spec.obs_dtype):
        return "sequential"
    return config.population.execution

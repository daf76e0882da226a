"""A run's parts built from its config, in one place: the environment's spec, the agent, the
strategy and the replay layout, and what follows from the config alone (a member's default
hparams, Atari's options, the replay's memory). The learner and every worker process use
these: agents are functions, which do not cross the spawn boundary, so each process rebuilds
its agent from the config; the `ReplaySpec` is plain data, derived once by the learner and
shipped to the collectors.
"""

from __future__ import annotations

from typing import Any

from fastpop import strategies
from fastpop.agents import Agent, make_agent
from fastpop.config.sections import Config
from fastpop.envs import env_spec
from fastpop.population import replay
from fastpop.schema import ConfigError
from fastpop.strategies.base import Strategy, StrategySetting
from fastpop.strategies.priors import parse_priors
from fastpop.types import EnvSpec


def build_env_spec(config: Config) -> EnvSpec:
    """Observation and action shapes of the config's training environment (for a brax id, its
    environment is built on `env.backend` once and kept for `brax_envs.make_brax_env`)."""
    return env_spec(config.env.id, atari_options(config), config.env.backend)


def build_agent(config: Config, spec: EnvSpec | None = None) -> Agent:
    """The config's agent for its environment; a ConfigError names an algo/env mismatch."""
    spec = build_env_spec(config) if spec is None else spec
    try:
        return make_agent(config.algo, spec, **config.agent)
    except ValueError as error:
        raise ConfigError(f"algo {config.algo!r} on {config.env.id}: {error}") from None


def strategy_setting(config: Config) -> StrategySetting:
    """What the config's strategy is built from: its section and the run's shape."""
    section = config.strategy_sections.get(config.strategy)
    return StrategySetting(
        section,
        config.strategy_sections,
        config.population,
        parse_priors(config.population.priors),
        config.hparams,
        config.seed,
        config.eval.interval,
        config.train.total_env_steps,
    )


def build_strategy(config: Config) -> Strategy:
    """The strategy the config names (`strategies.make_strategy`)."""
    return strategies.make_strategy(config.strategy, strategy_setting(config))


def member_overrides(config: Config) -> list[dict]:
    """Per member, the hparams its strategy starts it with (beyond `config.hparams`)."""
    return strategies.member_overrides(config.strategy, strategy_setting(config))


def build_replay_spec(config: Config, spec: EnvSpec) -> replay.ReplaySpec:
    """The layout of one replay buffer: per member, or the one all members share."""
    capacity, lanes = replay_layout(config)
    return replay.make_replay_spec(spec, capacity, lanes, config.collect.chunk_len)


def default_member_hparams(config: Config, agent) -> Any:
    """One member's HParams: the agent's defaults with the config's values (dtypes kept)."""
    import jax
    import numpy as np

    from fastpop.agents.base import hparam_dtype

    defaults = agent.default_hparams()
    values = {
        name: np.asarray(value, hparam_dtype(getattr(defaults, name)))
        for name, value in config.hparams.items()
        if value is not None  # null: the agent's default (of the env, of its config)
    }
    return defaults._replace(**jax.device_put(values))


def initial_hparams(config: Config, agent) -> Any:
    """Stacked hparams of every member: the config's values and the strategy's overrides."""
    from fastpop import population

    overrides = member_overrides(config)
    return population.broadcast_hparams(
        default_member_hparams(config, agent),
        config.population.size,
        **{name: [o[name] for o in overrides] for name in (overrides[0] if overrides else {})},
    )


def atari_options(config: Config):
    """The `AtariOptions` of this config's training environments (None for other envs)."""
    from fastpop.envs import AtariOptions

    if not config.env.id.startswith("ALE/"):
        return None
    return AtariOptions(terminal_on_life_loss=config.env.atari_terminal_on_life_loss)


def replay_layout(config: Config) -> tuple[int, int]:
    """(capacity, lanes) of one replay buffer: per member, or the one shared by all members."""
    size, lanes = config.population.size, config.collect.envs_per_member
    if config.replay.shared:
        return config.replay.capacity * size, lanes * size
    return config.replay.capacity, lanes


def memory_estimate(config: Config, env_spec, available_bytes: int | None = None):
    """`population.replay.memory_estimate` of this config's buffers (see `replay_layout`)."""
    capacity, lanes = replay_layout(config)
    size, shared = config.population.size, config.replay.shared
    return replay.memory_estimate(env_spec, capacity, lanes, size, shared, available_bytes)

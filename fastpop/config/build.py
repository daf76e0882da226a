"""A run's parts built from its config, in one place: the environment's spec, the agent and the
replay layout. The learner and every worker process use these: agents are functions, which do not
cross the spawn boundary, so each process rebuilds its agent from the config; the `ReplaySpec` is
plain data, derived once by the learner and shipped to the collectors.
"""

from __future__ import annotations

from fastpop import config as config_lib
from fastpop.agents import Agent, make_agent
from fastpop.envs import env_spec
from fastpop.population import replay
from fastpop.types import EnvSpec


def build_env_spec(config: config_lib.Config) -> EnvSpec:
    """Observation and action shapes of the config's training environment (for a brax id, its
    environment is built on `env.backend` once and kept for `brax_envs.make_brax_env`)."""
    return env_spec(config.env.id, config_lib.atari_options(config), config.env.backend)


def build_agent(config: config_lib.Config, spec: EnvSpec | None = None) -> Agent:
    """The config's agent for its environment; a ConfigError names an algo/env mismatch."""
    spec = build_env_spec(config) if spec is None else spec
    try:
        return make_agent(config.algo, spec, **config.agent)
    except ValueError as error:
        raise config_lib.ConfigError(f"algo {config.algo!r} on {config.env.id}: {error}") from None


def build_replay_spec(config: config_lib.Config, spec: EnvSpec) -> replay.ReplaySpec:
    """The layout of one replay buffer: per member, or the one all members share."""
    capacity, lanes = config_lib.replay_layout(config)
    return replay.make_replay_spec(spec, capacity, lanes, config.collect.chunk_len)

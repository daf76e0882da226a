"""Agents: factories returning pure per-member functions (see base.Agent)."""

from fastpop.agents.base import Agent
from fastpop.agents.dqn import DQNConfig, DQNHParams, make_dqn
from fastpop.agents.sac import SACConfig, SACHParams, make_sac
from fastpop.agents.td3 import TD3Config, TD3HParams, make_td3

ALGORITHMS = ("td3", "sac", "dqn")


def make_agent(algo: str, spec, **config_fields) -> Agent:
    """Build an agent by name; `config_fields` go to that algorithm's config dataclass."""
    factories = {
        "td3": (make_td3, TD3Config),
        "sac": (make_sac, SACConfig),
        "dqn": (make_dqn, DQNConfig),
    }
    if algo not in factories:
        raise ValueError(f"unknown algorithm {algo!r}; choose one of {', '.join(ALGORITHMS)}")
    factory, config_type = factories[algo]
    return factory(spec, config_type(**config_fields))


__all__ = [
    "ALGORITHMS",
    "Agent",
    "DQNConfig",
    "DQNHParams",
    "SACConfig",
    "SACHParams",
    "TD3Config",
    "TD3HParams",
    "make_agent",
    "make_dqn",
    "make_sac",
    "make_td3",
]

"""Agents: factories returning pure per-member functions (see base.Agent), found by name in
`registry` (one `AlgorithmEntry` per algorithm)."""

from fastpop.agents import registry
from fastpop.agents.base import Agent, AlgorithmEntry
from fastpop.agents.dqn import DQNConfig, DQNHParams, make_dqn
from fastpop.agents.sac import SACConfig, SACHParams, make_sac
from fastpop.agents.td3 import TD3Config, TD3HParams, make_td3
from fastpop.compilation.shared_programs import shared

ALGORITHMS = registry.NAMES  # live: names registered at run time included


def make_agent(algo: str, spec, **config_fields) -> Agent:
    """Build an agent by name; `config_fields` go to that algorithm's config dataclass. Equal
    arguments give the same agent (`compilation.shared_programs`): its programs are shared."""
    entry = registry.get(algo)
    if spec.policy_obs_size and not entry.asymmetric:
        asymmetric = ", ".join(registry.names_with(asymmetric=True))
        raise ValueError(
            f"the env's observation holds privileged state for the critics alone (an "
            f"asymmetric actor-critic), which {algo} does not separate; use {asymmetric}"
        )
    return _made(entry.make, spec, entry.config_type(**config_fields))


@shared
def _made(make, spec, config) -> Agent:
    return make(spec, config)


__all__ = [
    "ALGORITHMS",
    "Agent",
    "AlgorithmEntry",
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
    "registry",
]

"""Population strategies: what happens to members between evaluations.

    independent   members differ by seed and by config-given hparams (a grid or prior samples)
    pbt           population-based training: whole-state exploit, bounded explore
    pb2           PBT whose explore is a time-varying GP bandit (population-based bandits)
    halving       successive halving (asynchronous, ASHA's rule): stopped trials restart fresh
    branch_merge  every round all members restart from the promoted (best) member
    cemrl         CEM over actor parameters, half the samples trained against a shared critic
    dvd           TD3 actors coupled by a diversity (log det) term, shared critic, adaptive lambda
    schedule      every member follows one fixed hparam schedule (fastpop pbt-replay)

Each strategy's module defines its `StrategyEntry` (`base.py`) and `registry.py` lists them:
`make_strategy(config)` builds the one a config names; `member_overrides(config)` gives each
member's initial hparams that differ from `config.hparams`, `member_configurations(config)` which
configuration and which seed of it each member is. See `strategies.base` for the interface.
"""

from __future__ import annotations


def member_overrides(config) -> list[dict]:
    """Per member, the hparams its strategy starts it with (beyond `config.hparams`)."""
    from fastpop.strategies import independent, registry
    from fastpop.strategies.priors import config_priors

    overrides = registry.get(config.strategy).member_overrides
    if overrides is not None:
        return overrides(config)
    population = config.population
    return independent.member_overrides(
        population.size, population.grid, config_priors(config), config.seed, population.seeds
    )


def member_configurations(config) -> list[dict]:
    """Per member, `{"config_index": c, "seed_index": s}`: member m is seed m % seeds of
    configuration m // seeds (`population.seeds`; 1 for strategies whose members interact, so
    there every member is its own configuration). Seeds of one configuration start with equal
    hparams; members differ in network init, environment and noise seeds whatever their index."""
    seeds = config.population.seeds
    return [
        dict(zip(("config_index", "seed_index"), divmod(member, seeds), strict=True))
        for member in range(config.population.size)
    ]


def config_priors(config) -> dict:
    """The config's `population.priors`, parsed (`priors.config_priors`)."""
    from fastpop.strategies.priors import config_priors as parsed

    return parsed(config)


def entry_of(config):
    """The registry entry (`base.StrategyEntry`) of the strategy the config names."""
    from fastpop.strategies import registry

    return registry.get(config.strategy)


def make_strategy(config):
    """The `Strategy` the config names, built by its registry entry."""
    return entry_of(config).make(config)

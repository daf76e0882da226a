"""Population strategies: what happens to members between evaluations.

    independent   members differ by seed and by config-given hparams (a grid or prior samples)
    pbt           population-based training: whole-state exploit, bounded explore
    pb2           PBT whose explore is a time-varying GP bandit (population-based bandits)
    mfpbt         multiple-frequencies PBT: sub-populations evolving at their own frequencies
    halving       successive halving (asynchronous, ASHA's rule): stopped trials restart fresh
    branch_merge  every round all members restart from the promoted (best) member
    cemrl         CEM over actor parameters, half the samples trained against a shared critic
    dvd           TD3 actors coupled by a diversity (log det) term, shared critic, adaptive lambda
    schedule      every member follows one fixed hparam schedule (fastpop pbt-replay)

Each strategy's module defines its `StrategyEntry` (`base.py`) and `registry.py` lists them:
`make_strategy(name, setting)` builds one from its section and the run's shape
(`base.StrategySetting`, made by `fastpop.config.build.strategy_setting`); `member_overrides`
gives each member's initial hparams that differ from `config.hparams`, `member_configurations`
which configuration and which seed of it each member is. See `strategies.base` for the
interface.
"""

from __future__ import annotations


def member_overrides(name: str, setting) -> list[dict]:
    """Per member, the hparams strategy `name` starts it with (beyond `setting.hparams`);
    `setting`: a `base.StrategySetting`."""
    from fastpop.strategies import independent, registry

    overrides = registry.get(name).member_overrides
    if overrides is not None:
        return overrides(setting)
    population = setting.population
    return independent.member_overrides(
        population.size, population.grid, setting.priors, setting.seed, population.seeds
    )


def member_configurations(population) -> list[dict]:
    """Per member, `{"config_index": c, "seed_index": s}`: member m is seed m % seeds of
    configuration m // seeds (`population.seeds`; 1 for strategies whose members interact, so
    there every member is its own configuration). Seeds of one configuration start with equal
    hparams; members differ in network init, environment and noise seeds whatever their index.
    `population`: the config's `population:` section."""
    return [
        dict(zip(("config_index", "seed_index"), divmod(member, population.seeds), strict=True))
        for member in range(population.size)
    ]


def make_strategy(name: str, setting):
    """The `Strategy` named `name`, built by its registry entry from a `base.StrategySetting`
    and carrying that entry (`Strategy.entry`): its flags are read from the entry alone."""
    from fastpop.strategies import registry

    entry = registry.get(name)
    return entry.make(setting)._replace(entry=entry)

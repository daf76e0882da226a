"""Population strategies: what happens to members between evaluations.

    independent   members differ by seed and by config-given hparams (a grid or prior samples)
    pbt           population-based training: whole-state exploit, bounded explore
    pb2           PBT whose explore is a time-varying GP bandit (population-based bandits)
    halving       successive halving (asynchronous, ASHA's rule): stopped trials restart fresh
    branch_merge  every round all members restart from the promoted (best) member
    cemrl         CEM over actor parameters, half the samples trained against a shared critic
    dvd           TD3 actors coupled by a diversity (log det) term, shared critic, adaptive lambda
    schedule      every member follows one fixed hparam schedule (fastpop pbt-replay)

`make_strategy(config)` builds the one a config names; `member_overrides(config)` gives each
member's initial hparams that differ from `config.hparams`, `member_configurations(config)` which
configuration and which seed of it each member is. See `strategies.base` for the interface.
"""

from __future__ import annotations

STRATEGIES = ("independent", "pbt", "pb2", "halving", "branch_merge", "cemrl", "dvd", "schedule")
SHARED_CRITIC = ("cemrl", "dvd")  # TD3 members with one shared critic and replay


def member_overrides(config) -> list[dict]:
    """Per member, the hparams its strategy starts it with (beyond `config.hparams`)."""
    from fastpop.strategies import branch_merge, independent

    population = config.population
    if config.strategy == "branch_merge":
        multipliers = config.branch_merge.step_size_multipliers
        multipliers = multipliers or branch_merge.default_step_size_multipliers(population.size)
        return branch_merge.member_overrides(config.hparams, multipliers)
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
    from fastpop.strategies.priors import parse_prior

    return {name: parse_prior(name, spec) for name, spec in config.population.priors.items()}


def make_strategy(config):
    from fastpop.strategies.branch_merge import make_branch_merge
    from fastpop.strategies.independent import make_independent
    from fastpop.strategies.pbt import PBTSettings, make_pbt

    size = config.population.size
    if config.strategy in ("pbt", "pb2"):
        pbt = config.pbt
        settings = PBTSettings(
            pbt.interval,
            config.eval.interval,
            pbt.bottom_fraction,
            pbt.top_fraction,
            pbt.perturb_factors,
            pbt.resample_probability,
            pbt.fitness_window,
            copy_replay=pbt.replay == "copy",
            wait=pbt.wait,
        )
        if config.strategy == "pb2":
            from fastpop.strategies.pb2 import make_pb2

            return make_pb2(size, config_priors(config), config.seed, settings, config.pb2.window)
        return make_pbt(size, config_priors(config), config.seed, settings)
    if config.strategy == "halving":
        from fastpop.strategies import halving as asha

        halving, eta = config.halving, config.halving.reduction_factor
        rungs = asha.rung_schedule(halving.first_rung, eta, config.train.total_env_steps)
        bottom = halving.bottom_fraction
        bottom = asha.asha_bottom_fraction(eta) if bottom is None else bottom
        settings = asha.HalvingSettings(rungs, bottom, config.eval.interval)
        return asha.make_halving(size, config_priors(config), config.seed, settings)
    if config.strategy == "branch_merge":
        return make_branch_merge(size, config.branch_merge.round_steps)
    if config.strategy == "cemrl":
        from fastpop.strategies.cemrl import make_cemrl

        return make_cemrl(size, config.cemrl, config.cemrl.generation_steps)
    if config.strategy == "dvd":
        from fastpop.strategies.dvd import make_dvd

        return make_dvd(size, config.dvd, config.seed, config.eval.interval)
    if config.strategy == "schedule":
        from fastpop.strategies.schedule import make_schedule

        schedule = config.schedule
        return make_schedule(size, schedule.changes, config.eval.interval, schedule.wait)
    return make_independent(config.eval.interval)

"""The checks that tie a config's strategy to the rest of it (`population.grid/priors`, sizes,
devices), read from its registry entry's flags and `check`; and the strategies' config sections
(`pbt:`, `halving:`, ... in a preset), defined in their modules and re-exported here.

The sections are frozen dataclasses with a docstring per field and allowed values as metadata,
read and validated by `fastpop.config` like every other section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, Protocol

from fastpop.agents import registry
from fastpop.schema import Reader, coerce, show
from fastpop.strategies import registry as strategies
from fastpop.strategies.branch_merge import BranchMergeConfig
from fastpop.strategies.cemrl import CEMRLConfig
from fastpop.strategies.dvd import DvDConfig
from fastpop.strategies.halving import HalvingConfig
from fastpop.strategies.pb2 import PB2Config
from fastpop.strategies.pbt import PBTConfig

__all__ = [
    "BranchMergeConfig",
    "CEMRLConfig",
    "DvDConfig",
    "HalvingConfig",
    "PB2Config",
    "PBTConfig",
    "check_member_hparams",
    "check_strategy",
]


class CheckedConfig(Protocol):
    """What the checks below read of a `fastpop.config.Config` (which holds the sections above:
    a protocol, so that this module needs no import of `fastpop.config`, which imports it)."""

    @property
    def algo(self) -> str: ...
    @property
    def strategy(self) -> str: ...
    @property
    def agent(self) -> dict: ...
    @property
    def population(self) -> Any: ...
    @property
    def replay(self) -> Any: ...
    @property
    def train(self) -> Any: ...


def check_member_hparams(
    r: Reader, population, specs: dict, given: Collection[str] = (), strategy: str = "independent"
):
    """Grid values typed and in range, priors parseable and inside the hparam's range; the size
    and the seeds per configuration resolved (`population_sizes`). `given`: the population keys
    the config sets."""
    from fastpop.strategies.priors import parse_prior

    grid = {}
    for name, grid_values in population.grid.items():
        dotted = f"population.grid.{name}"
        if name not in specs:
            r.unknown(dotted, list(specs), " (the algo's hparams)")
        if not isinstance(grid_values, list) or not grid_values:
            r.fail(dotted, f"expected a non-empty list of values, got {show(grid_values)}")
        tp, allowed, _ = specs[name]
        grid[name] = [coerce(r, dotted, value, tp, allowed) for value in grid_values]
    for name, spec in population.priors.items():
        dotted = f"population.priors.{name}"
        if name not in specs:
            r.unknown(dotted, list(specs), " (the algo's hparams)")
        if name in grid:
            r.fail(dotted, "is also in population.grid; give each hparam one source")
        try:
            prior = parse_prior(name, spec)
        except ValueError as error:
            r.fail(dotted, str(error))
        tp, allowed, _ = specs[name]
        for bound in prior.values or (prior.low, prior.high):
            coerce(r, f"{dotted} (a bound)", bound, float, allowed)
        if tp in (int, int | None) and not prior.integer:
            r.fail(dotted, "is an integer hparam: use int_uniform or a choice of integers")
    population = dataclasses.replace(population, grid=grid)
    size, seeds = population_sizes(r, population, set(given), strategy)
    return dataclasses.replace(population, size=size, seeds=seeds)


def population_sizes(r: Reader, population, given: set[str], strategy: str) -> tuple[int, int]:
    """(population.size, population.seeds) resolved: members = configurations * seeds, where the
    configurations are the grid's combinations (or the one config), or with priors every draw."""
    from fastpop.strategies.independent import grid_size

    size, seeds, grid = population.size, population.seeds, population.grid
    combinations = grid_size(grid)
    interacting = not strategies.get(strategy).independent_members
    if interacting and "seeds" in given and seeds != 1:
        independent = strategies.names_with(independent_members=True)
        r.fail(
            "population.seeds",
            f"repeats configurations whose members never interact ("
            f"{', '.join(independent)}); the members of strategy {strategy} interact, "
            f"so they are not seeds of one configuration: leave it at 1 (run the population "
            f"again with another seed= instead), got {seeds}",
        )
    if interacting or "seeds" not in given:
        if grid and "size" not in given:
            size = combinations
        elif size % combinations:
            r.fail(
                "population.size",
                f"must be a multiple of the grid's {combinations} combinations (each repeated "
                f"with other seeds), got {size}; e.g. population.size={combinations}",
            )
        if interacting or population.priors:
            return size, 1  # every member its own configuration (its own draw)
        return size, size // combinations
    what = f"the grid's {combinations} combinations" if grid else "1 configuration"
    unit = combinations * seeds
    if "size" not in given and (grid or not population.priors):
        return unit, seeds
    if population.priors and size % unit:
        r.fail(
            "population.size",
            f"must be a multiple of {what} x population.seeds ({seeds}) = {unit} (with priors "
            f"every configuration is one draw, trained with {seeds} seeds), got {size}; "
            f"e.g. population.size={unit * max(size // unit, 1)}",
        )
    if not population.priors and size != unit:
        r.fail(
            "population.size",
            f"must be {what} x population.seeds ({seeds}) = {unit}, got {size}; set "
            f"population.size={unit} or leave it out (it follows)",
        )
    return size, seeds


def check_shared_critic(r: Reader, c: CheckedConfig) -> None:
    strategy = c.strategy
    checks = (
        ("algo", not registry.get(c.algo).shared_critic,
         f"strategy {strategy} trains members with a deterministic actor and twin critics "
         f"({' or '.join(registry.names_with(shared_critic=True))}); got {c.algo!r}"),
        ("replay.shared", not c.replay.shared,
         f"strategy {strategy} trains on one shared replay buffer: set replay.shared: true"),
        ("population.execution", c.population.execution != "vectorized",
         f"strategy {strategy} updates the population in one program: use vectorized"),
        ("population.grid", bool(c.population.grid or c.population.priors),
         f"strategy {strategy} shares one critic, whose hparams are equal across members; "
         "population.grid and population.priors are for independent and pbt"),
        ("agent.observation_norm", bool(c.agent.get("observation_norm")),
         f"strategy {strategy} trains the members' actors against one shared critic, which "
         "does not normalize observations: set agent.observation_norm: false"),
        ("agent.target_actor", c.agent.get("target_actor") is False,
         f"strategy {strategy}'s shared critic learns from each member's target actor: set "
         "agent.target_actor: true"),
        ("agent.target_critic_every_step", bool(c.agent.get("target_critic_every_step")),
         f"strategy {strategy}'s shared critic updates its targets on the actor steps: set "
         "agent.target_critic_every_step: false"),
    )  # fmt: skip
    for dotted, violated, problem in checks:
        if violated:
            r.fail(dotted, problem)


def check_devices(r: Reader, c: CheckedConfig) -> None:
    """population.devices: 1, a positive integer dividing population.size, or all (checked
    against the machine when the learner starts, `fastpop.population.sharding.device_count`)."""
    devices, size = c.population.devices, c.population.size
    if devices != "all" and (isinstance(devices, bool) or not isinstance(devices, int)):
        r.fail("population.devices", f"expected a positive integer or all, got {show(devices)}")
    if devices == 1:
        return
    if devices != "all" and devices < 1:
        r.fail("population.devices", f"must be >= 1 (or all), got {devices}")
    if c.population.execution == "sequential":
        r.fail(
            "population.devices",
            f"sequential execution updates one member at a time on one device; set "
            f"population.devices: 1 or population.execution: vectorized, got {devices}",
        )
    if devices != "all" and size % devices:
        r.fail(
            "population.devices",
            f"population.size ({size}) must split evenly over the devices; set "
            f"population.devices to a divisor of {size}"
            f"{strategies.get(c.strategy).devices_note} or population.size to a multiple of "
            f"{devices}, got {devices}",
        )


def check_strategy(r: Reader, c: CheckedConfig) -> None:
    """The checks the strategy's entry asks for (flags first, then its own `check`)."""
    check_devices(r, c)
    size, strategy = c.population.size, c.strategy
    entry = strategies.get(strategy)
    if not entry.independent_members and size < 2:
        r.fail("population.size", f"strategy {strategy} needs at least 2 members, got {size}")
    if entry.shared_critic:
        check_shared_critic(r, c)
    if entry.check is not None:
        entry.check(r, c)
    if entry.needs_priors and not c.population.priors:
        r.fail(
            "population.priors",
            f"strategy {strategy} draws the hparams that have a prior; declare at least one, "
            "e.g. {actor_lr: {log_uniform: [3.0e-5, 3.0e-3]}}",
        )

"""Config sections of the strategies (`pbt:`, `branch_merge:`, `cemrl:`, `dvd:` in a preset)
and the checks that tie them to the rest of a config (`population.grid/priors`, sizes).

Frozen dataclasses with a docstring per field and allowed values as metadata, read and validated
by `fastpop.config` like every other section.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any, Protocol

from fastpop.agents import registry
from fastpop.schema import Reader, coerce, field, show
from fastpop.strategies import SHARED_CRITIC

# Strategies whose members never exchange anything: members with equal initial hparams are
# seeds of one configuration (`population.seeds`).
INDEPENDENT_MEMBERS = ("independent", "schedule")


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    interval: int = field(50_000, min=1)
    """Env steps per member between exploit/explore rounds (each on the next evaluation)."""
    bottom_fraction: float = field(0.25, gt=0, max=1)
    """Share of members (ranked by fitness) that copy a member from the top."""
    top_fraction: float = field(0.25, gt=0, max=1)
    """Share of members the copied-from member is drawn from."""
    perturb_factors: tuple[float, ...] = field((0.8, 1.2), gt=0)
    """Explore multiplies each copied hparam by one of these, drawn uniformly."""
    resample_probability: float = field(0.25, min=0, max=1)
    """Chance that explore resamples an hparam from its prior instead of perturbing it."""
    fitness_window: int = field(1, min=1)
    """Evaluations averaged into a member's fitness (its latest ones since it last copied,
    after its last NaN return: a member reset after a NaN is judged on what it did since)."""
    replay: str = field("keep", choices=("keep", "copy"))
    """keep: a copying member keeps its own buffer; copy: it takes the source's buffer too."""
    wait: bool = False
    """The learner makes no update while an evaluation is pending, so a round acts on the
    policies it ranked, not on ones trained further meanwhile (Ray Tune's synchronous PBT);
    false: updates go on while the evaluator works and a round lands when its result arrives
    (asynchronous: no waiting, but the last rounds of a short run may come after training ends)."""


@dataclasses.dataclass(frozen=True)
class PB2Config:
    window: int = field(10, min=1)
    """Latest evaluations whose observations (hparams, change of return) the GP is fitted to;
    its time-varying kernel weighs older ones less still. At most the newest 1,000 observations
    (whole evaluations) are used: a round's time grows with their cube."""


@dataclasses.dataclass(frozen=True)
class HalvingConfig:
    first_rung: int = field(10_000, min=1)
    """A trial's age (env steps per member since it started) at its first rung."""
    reduction_factor: float = field(3.0, gt=1)
    """Each rung is this many times older than the one before."""
    bottom_fraction: float | None = field(None, gt=0, max=1)
    """Share of the returns recorded at a rung whose trials are stopped there (in (0, 1));
    null: ASHA's 1 - 1/reduction_factor (2/3 at 3: the top third goes on to the next rung,
    which is reduction_factor times older)."""


@dataclasses.dataclass(frozen=True)
class BranchMergeConfig:
    round_steps: int = field(10_000, min=1)
    """Env steps per member in one round; every round ends with an evaluation of all members."""
    step_size_multipliers: tuple[float, ...] | None = field(None, min=0)
    """Per member factor on every learning rate; null: the first member 0.1, the others 1."""


@dataclasses.dataclass(frozen=True)
class CEMRLConfig:
    generation_steps: int = field(5_000, min=1)
    """Env steps per member in one generation; each ends with an evaluation of every member."""
    trained_fraction: float = field(0.5, min=0, max=1)
    """Share of the sampled actors that take TD3 actor steps against the shared critic."""
    elite_fraction: float = field(0.5, gt=0, max=1)
    """Share of the sampled actors, best first, that the distribution is refitted to."""
    initial_variance: float = field(1e-3, gt=0)
    """Variance of every actor parameter in the first generation."""
    initial_noise: float = field(1e-3, min=0)
    """Variance added at the first refit (keeps the search from collapsing)."""
    noise_decay: float = field(0.95, min=0, max=1)
    """Per generation: noise <- decay * noise + (1 - decay) * noise_floor."""
    noise_floor: float = field(1e-5, min=0)
    """What the added variance decays towards."""


@dataclasses.dataclass(frozen=True)
class DvDConfig:
    coefficients: tuple[float, ...] = field((0.0, 0.5), min=0)
    """The bandit's arms: values of lambda, the weight of -log det K in the actor loss."""
    adapt: str = field("bandit", choices=("bandit", "fixed"))
    """bandit: Thompson sampling over `coefficients` as the authors' code does it (an arm is
    rewarded when the population's mean return beats the best of 5 earlier rounds; posteriors
    over the latest 50 judged rounds; the first 5 picks uniform); fixed: lambda = the first
    coefficient throughout."""
    embedding_states: int = field(20, min=2)
    """States in the shared batch whose actions make a member's behavioural embedding."""
    length_scale: float = field(1.0, gt=0)
    """RBF kernel length scale, on the mean squared action difference."""
    jitter: float = field(1e-3, gt=0)
    """Added to K's diagonal before the log-determinant."""


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
    def pbt(self) -> PBTConfig: ...
    @property
    def branch_merge(self) -> BranchMergeConfig: ...
    @property
    def dvd(self) -> DvDConfig: ...
    @property
    def halving(self) -> HalvingConfig: ...
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
        if tp is int and not prior.integer:
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
    interacting = strategy not in INDEPENDENT_MEMBERS
    if interacting and "seeds" in given and seeds != 1:
        r.fail(
            "population.seeds",
            f"repeats configurations whose members never interact ("
            f"{', '.join(INDEPENDENT_MEMBERS)}); the members of strategy {strategy} interact, "
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
    strategy, size = c.strategy, c.population.size
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
        ("population.size", strategy == "cemrl" and (size < 3 or size % 2 == 0),
         f"cemrl needs 1 (the CEM mean) + an even number of mirrored samples, e.g. 11; "
         f"got {size}"),
        ("dvd.embedding_states",
         strategy == "dvd" and c.dvd.embedding_states > c.agent["batch_size"],
         f"must be <= agent.batch_size ({c.agent['batch_size']}): the embedding states are "
         f"taken from one sampled batch, got {c.dvd.embedding_states}"),
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
        odd = " (cemrl's size is 1 + an even number: use an odd device count)"
        r.fail(
            "population.devices",
            f"population.size ({size}) must split evenly over the devices; set "
            f"population.devices to a divisor of {size}"
            f"{odd if c.strategy == 'cemrl' else ''} or population.size to a multiple of "
            f"{devices}, got {devices}",
        )


def check_strategy(r: Reader, c: CheckedConfig) -> None:
    from fastpop.strategies.pbt import selection_sizes

    check_devices(r, c)
    size, strategy = c.population.size, c.strategy
    if strategy not in ("independent", "schedule") and size < 2:
        r.fail("population.size", f"strategy {strategy} needs at least 2 members, got {size}")
    if strategy in ("pbt", "pb2"):
        try:
            selection_sizes(size, c.pbt.bottom_fraction, c.pbt.top_fraction)
        except ValueError as error:
            r.fail("pbt", str(error))
    if strategy == "halving":
        check_halving(r, c)
    if strategy in ("pbt", "pb2", "halving") and not c.population.priors:
        r.fail(
            "population.priors",
            f"strategy {strategy} draws the hparams that have a prior; declare at least one, "
            "e.g. {actor_lr: {log_uniform: [3.0e-5, 3.0e-3]}}",
        )
    if strategy in SHARED_CRITIC:
        check_shared_critic(r, c)
    if strategy == "branch_merge":
        if c.population.grid or c.population.priors:
            r.fail(
                "population.grid",
                "branch_merge members differ by branch_merge.step_size_multipliers; "
                "population.grid and population.priors are for independent and pbt",
            )
        multipliers = c.branch_merge.step_size_multipliers
        if multipliers is not None and len(multipliers) != size:
            r.fail(
                "branch_merge.step_size_multipliers",
                f"needs one multiplier per member ({size}), got {len(multipliers)}",
            )


def check_halving(r: Reader, c: CheckedConfig) -> None:
    from fastpop.strategies.halving import rung_schedule

    halving, total = c.halving, c.train.total_env_steps
    if halving.bottom_fraction is not None and halving.bottom_fraction >= 1:
        r.fail(
            "halving.bottom_fraction",
            f"must be in (0, 1): the share of a rung's trials stopped there, got "
            f"{halving.bottom_fraction}",
        )
    if not rung_schedule(halving.first_rung, halving.reduction_factor, total):
        r.fail(
            "halving.first_rung",
            f"the rung schedule is empty: the first rung ({halving.first_rung} env steps per "
            f"member) must be below train.total_env_steps ({total})",
        )

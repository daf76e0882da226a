"""Independent members: a sweep run as one population. Members differ by seed and by the hparams
the config gives them, as a grid of combinations or as samples from priors; nothing moves between
them during training."""

from __future__ import annotations

import itertools

from fastpop.strategies.base import PRIOR_STREAM, Strategy, StrategyEntry, stream_rng
from fastpop.strategies.priors import Prior


def grid_size(grid: dict[str, list]) -> int:
    size = 1
    for values in grid.values():
        size *= len(values)
    return size


def grid_combinations(grid: dict[str, list]) -> list[dict]:
    """Every combination, in the order the grid is written with the last hparam varying fastest."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*grid.values())]


def member_overrides(
    size: int, grid: dict[str, list], priors: dict[str, Prior], seed: int, seeds: int = 1
) -> list[dict]:
    """Each member's hparams that differ from the config's. There are size // seeds
    configurations, each trained by `seeds` neighbouring members (member m is seed m % seeds of
    configuration m // seeds); configuration c takes grid combination c // (configurations //
    combinations), so repeats of one combination are neighbours, and one draw per prior.
    """
    combinations = grid_combinations(grid)
    configurations = size // seeds
    repeats = configurations // len(combinations)
    rng = stream_rng(seed, PRIOR_STREAM)
    drawn = [
        {**combinations[index // repeats], **{n: p.sample(rng) for n, p in priors.items()}}
        for index in range(configurations)
    ]
    return [dict(drawn[member // seeds]) for member in range(size)]


def make_independent(evaluation_interval: int) -> Strategy:
    return Strategy(
        name="independent",
        evaluation_interval=evaluation_interval,
        waits_for_evaluation=False,
        init=lambda: (),
        step=lambda state, evaluation, hparams: (state, None),
    )


ENTRY = StrategyEntry(
    name="independent",
    make=lambda setting: make_independent(setting.evaluation_interval),
    independent_members=True,
    acts_on_evaluations=False,
)

"""Branch and merge (the pooled-process worm, ../shared/seeds/000): every round each member starts
from the best member's state and trains on its own, with its own step size and its own exploration
noise; an evaluation with the policies held constant then promotes one member to the next round.

One member with a small step size (0.1x by default) guards against rounds whose updates are too
large: if the bold members produce degenerate policies, the careful one is promoted instead.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from fastpop.schema import field
from fastpop.strategies.base import Evaluation, Selection, Strategy, StrategyEntry
from fastpop.strategies.pbt import rank


@dataclasses.dataclass(frozen=True)
class BranchMergeConfig:
    round_steps: int = field(10_000, min=1)
    """Env steps per member in one round; every round ends with an evaluation of all members."""
    step_size_multipliers: tuple[float, ...] | None = field(None, min=0)
    """Per member factor on every learning rate; null: the first member 0.1, the others 1."""


def default_step_size_multipliers(size: int) -> tuple[float, ...]:
    return (0.1,) + (1.0,) * (size - 1)


def is_step_size(hparam: str) -> bool:
    return hparam.endswith("_lr") or hparam == "learning_rate"


def member_overrides(base: dict, multipliers: tuple[float, ...]) -> list[dict]:
    """Each member's learning rates: the config's times its multiplier."""
    rates = {name: value for name, value in base.items() if is_step_size(name)}
    return [{name: value * m for name, value in rates.items()} for m in multipliers]


class BranchMergeState(NamedTuple):
    rounds: int


def make_branch_merge(size: int, round_steps: int) -> Strategy:
    if size < 2:
        raise ValueError(f"branch_merge needs a population of at least 2 members, got {size}")

    def step(state: BranchMergeState, evaluation: Evaluation, hparams: list[dict]):
        returns = evaluation.returns
        promoted = int(rank(returns)[0])
        if not np.isfinite(returns[promoted]):
            return state._replace(rounds=state.rounds + 1), None  # nobody to promote
        events = [
            {
                "strategy": "branch_merge",
                "kind": "branch",
                "round": state.rounds,
                "eval_index": evaluation.eval_index,
                "member_env_steps": evaluation.member_env_steps,
                "target": member,
                "source": promoted,
                "target_fitness": returns[member],
                "source_fitness": returns[promoted],
                "old_hparams": hparams[member],
                "new_hparams": hparams[member],  # a member keeps its own step size
            }
            for member in range(size)
            if member != promoted
        ]
        sources = np.full(size, promoted)
        return BranchMergeState(state.rounds + 1), Selection(sources, hparams, events)

    return Strategy(
        name="branch_merge",
        evaluation_interval=round_steps,
        waits_for_evaluation=True,
        init=lambda: BranchMergeState(0),
        step=step,
    )


def setting_overrides(setting) -> list[dict]:
    """Per member, its step sizes times its `branch_merge.step_size_multipliers`."""
    multipliers = setting.section.step_size_multipliers
    multipliers = multipliers or default_step_size_multipliers(setting.population.size)
    return member_overrides(setting.hparams, multipliers)


def check_multipliers(r, c) -> None:
    """Members differ by their multipliers only: no grid or priors, one multiplier each."""
    if c.population.grid or c.population.priors:
        r.fail(
            "population.grid",
            "branch_merge members differ by branch_merge.step_size_multipliers; "
            "population.grid and population.priors are for independent and pbt",
        )
    multipliers = c.section("branch_merge").step_size_multipliers
    if multipliers is not None and len(multipliers) != c.population.size:
        r.fail(
            "branch_merge.step_size_multipliers",
            f"needs one multiplier per member ({c.population.size}), got {len(multipliers)}",
        )


ENTRY = StrategyEntry(
    name="branch_merge",
    make=lambda setting: make_branch_merge(setting.population.size, setting.section.round_steps),
    config_type=BranchMergeConfig,
    check=check_multipliers,
    member_overrides=setting_overrides,
)

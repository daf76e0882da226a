"""A fixed hyperparameter schedule: every member follows the same list of changes, given as plain
data (`schedule.changes` in a config), with nothing copied between members.

`fastpop pbt-replay` builds one from a PBT member's ancestry (commands/pbt_replay.py) to train a
fresh member with the hparams PBT chose along that line, but not its copied weights: does the
schedule alone explain the member's result?

A change `{member_env_steps: S, hparams: {...}}` is applied after the first evaluation round taken
at or after S env steps per member (strategies decide between rounds): with `wait`, the learner
makes no update while a round is pending, so every update from the round at S on uses the new
values, as the PBT member's did after the round that changed them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from fastpop.schema import Reader, coerce, show
from fastpop.strategies.base import Evaluation, Selection, Strategy, StrategyEntry


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    changes: tuple = ()
    """The hparam changes every member takes, in order of env steps: a list of
    {member_env_steps: S, hparams: {name: value, ...}}, each applied after the first evaluation
    round at or after S env steps per member (`fastpop pbt-replay` writes one from a PBT
    member's ancestry). Members start from `hparams`."""
    wait: bool = True
    """The learner makes no update while an evaluation round is pending, so a change applies
    before any update past its round; false: updates go on and a change lands when its round's
    result arrives (as PBT's do: a little later, and not at the same update each run)."""


def check_schedule(r: Reader, schedule: ScheduleConfig, specs: dict, c) -> ScheduleConfig:
    """Each change a mapping of member_env_steps (an integer >= 0, in order) and known hparams
    with values of their type and range; strategy schedule takes no grid or priors (`c`: the
    config's strategy and population). Changes come back as a tuple of plain dicts."""
    if c.strategy == "schedule" and (c.population.grid or c.population.priors):
        r.fail(
            "population.priors" if c.population.priors else "population.grid",
            "schedule members all follow schedule.changes from the config's hparams; "
            "population.grid and population.priors are for independent and pbt",
        )
    raw = schedule.changes
    if not isinstance(raw, list | tuple):
        r.fail("schedule.changes", f"expected a list of changes, got {show(raw)}")
    changes, previous = [], 0
    for index, change in enumerate(raw):
        dotted = f"schedule.changes[{index}]"
        if not isinstance(change, dict) or set(change) != {"member_env_steps", "hparams"}:
            r.fail(
                dotted,
                "expected {member_env_steps: S, hparams: {name: value, ...}}, got "
                f"{show(change)}",
            )
        steps = coerce(r, f"{dotted}.member_env_steps", change["member_env_steps"], int, {"min": 0})
        if steps < previous:
            r.fail(f"{dotted}.member_env_steps", f"must be >= the previous change's {previous}")
        values = change["hparams"]
        if not isinstance(values, dict) or not values:
            r.fail(
                f"{dotted}.hparams", f"expected a mapping of hparams to values, got {show(values)}"
            )
        checked = {}
        for name, value in values.items():
            if name not in specs:
                r.unknown(f"{dotted}.hparams.{name}", list(specs), " (the algo's hparams)")
            tp, allowed, _ = specs[name]
            checked[name] = coerce(r, f"{dotted}.hparams.{name}", value, tp, allowed)
        changes.append({"member_env_steps": steps, "hparams": checked})
        previous = steps
    return dataclasses.replace(schedule, changes=tuple(changes))


class ScheduleState(NamedTuple):
    applied: int  # changes applied so far (they are sorted by member_env_steps)


def due_changes(changes: Sequence[dict], applied: int, member_env_steps: int) -> list[dict]:
    """The changes not applied yet whose step the round at `member_env_steps` has reached."""
    return [c for c in changes[applied:] if c["member_env_steps"] <= member_env_steps]


def make_schedule(
    size: int, changes: Sequence[dict], evaluation_interval: int, wait: bool = True
) -> Strategy:
    """Every member takes each change's hparams after the first evaluation round at or after its
    `member_env_steps`; `changes` sorted by `member_env_steps`. Sources are the identity."""
    changes = tuple(changes)
    steps = [c["member_env_steps"] for c in changes]
    if steps != sorted(steps):
        raise ValueError(f"schedule changes must be sorted by member_env_steps, got {steps}")

    def init() -> ScheduleState:
        return ScheduleState(applied=0)

    def step(state: ScheduleState, evaluation: Evaluation, hparams: list[dict]):
        due = due_changes(changes, state.applied, evaluation.member_env_steps)
        if not due:
            return state, None
        values = {name: value for change in due for name, value in change["hparams"].items()}
        new_hparams = [{**member, **values} for member in hparams]
        events = [
            {
                "strategy": "schedule",
                "kind": "scheduled",
                "eval_index": evaluation.eval_index,
                "member_env_steps": evaluation.member_env_steps,
                "scheduled_member_env_steps": due[-1]["member_env_steps"],
                "target": member,
                "source": member,
                "old_hparams": hparams[member],
                "new_hparams": new_hparams[member],
            }
            for member in range(size)
        ]
        selection = Selection(np.arange(size), new_hparams, events)
        return ScheduleState(state.applied + len(due)), selection

    return Strategy("schedule", evaluation_interval, wait, init, step)


ENTRY = StrategyEntry(
    name="schedule",
    make=lambda setting: make_schedule(
        setting.population.size,
        setting.section.changes,
        setting.evaluation_interval,
        setting.section.wait,
    ),
    config_type=ScheduleConfig,
    resolve_section=check_schedule,
    independent_members=True,
)

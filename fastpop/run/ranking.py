"""Members and trials ranked from a run's evaluation rows (halving runs several trials per
member slot; each of its rows names its trial), and what counts as a finite return."""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """A finite number (not a bool, a string or None)."""
    try:
        return not isinstance(value, bool | str) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def last_and_best(rounds: list[list[dict]], field: str) -> tuple[dict, dict]:
    """Per value of `field` (a member, a trial): its row of the latest round it is in, and
    its best finite return."""
    last: dict[int, dict] = {}
    best: dict[int, float] = {}
    for row in (row for group in rounds for row in group):
        key = int(row[field])
        last[key] = row
        if is_number(row["return_mean"]):
            best[key] = max(best.get(key, -math.inf), row["return_mean"])
    return last, best


def best_first(rows) -> list[dict]:
    """Rows by return, best first; a non-finite return last."""
    return sorted(
        rows, key=lambda r: -r["return_mean"] if is_number(r["return_mean"]) else math.inf
    )


def rank_trials(rounds: list[list[dict]]) -> list[dict]:
    """Trials (halving runs several per member slot) from best to worst at their last
    evaluation, with the slot that ran them and the member env steps they were evaluated over."""
    last, best = last_and_best(rounds, "trial")
    first: dict[int, int] = {}
    for row in (row for group in rounds for row in group):
        first.setdefault(int(row["trial"]), int(row["member_env_steps"]))
    return [
        {
            "trial": int(r["trial"]),
            "member": int(r["member"]),
            "final_return": float(r["return_mean"]),
            "best_return": best.get(int(r["trial"]), math.nan),
            "evaluated_from": first[int(r["trial"])],
            "evaluated_to": int(r["member_env_steps"]),
            "hparams": r["hparams"],
        }
        for r in best_first(last.values())
    ]

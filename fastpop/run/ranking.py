"""Trials ranked from a run's evaluation rows (halving runs several trials per member slot;
each row names its trial)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def rank_trials(rows: list[dict], is_number: Callable[[Any], bool]) -> list[dict]:
    """Trials (halving: several per member slot) from best to worst at their last evaluation,
    with the member slot that ran them and how far they got. `is_number`: a finite return."""
    last: dict[int, dict] = {}
    best: dict[int, float] = {}
    for row in rows:
        trial = int(row["trial"])
        last[trial] = row
        if is_number(row["return_mean"]):
            best[trial] = max(best.get(trial, -math.inf), row["return_mean"])
    first_step = {}
    for row in rows:
        first_step.setdefault(int(row["trial"]), int(row["member_env_steps"]))
    ordered = sorted(
        last.values(),
        key=lambda r: -r["return_mean"] if is_number(r["return_mean"]) else math.inf,
    )
    return [
        {
            "trial": int(r["trial"]),
            "member": int(r["member"]),
            "final_return": float(r["return_mean"]),
            "best_return": best.get(int(r["trial"]), math.nan),
            "evaluated_from": first_step[int(r["trial"])],  # member env steps
            "evaluated_to": int(r["member_env_steps"]),
            "hparams": r["hparams"],
        }
        for r in ordered
    ]

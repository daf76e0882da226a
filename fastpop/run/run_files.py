"""The files of a run directory, by name, and what reads them back: JSONL rows (a crash's
partial last line ignored), evaluation rows with null read as NaN, grouped into rounds, and a
run's headline numbers (`summarize`). What writes them is fastpop.run.metrics's `MetricsWriter`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fastpop.run.ranking import best_first, is_number, last_and_best, rank_trials

METRICS_FILE = "metrics.jsonl"
SCALARS_FILE = "scalars.jsonl"
EVENTS_FILE = "events.jsonl"
LINEAGE_FILE = "lineage.jsonl"
MEMBERS_FILE = "members.json"  # the strategy and each member's initial hparams, in member order
SUMMARY_FILE = "summary.json"


def _nan_for_null(value: Any) -> Any:
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {k: _nan_for_null(v) for k, v in value.items()}
    return value


def median(values: list[float]) -> float:
    """Median of finite values; NaN when there are none."""
    values = sorted(values)
    n = len(values)
    return (values[(n - 1) // 2] + values[n // 2]) / 2 if values else math.nan


def finite_returns(rows: Iterable[dict]) -> list[float]:
    return [float(r["return_mean"]) for r in rows if is_number(r["return_mean"])]


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; an unparsable LAST line (a crash mid-write) is ignored."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({error})") from error
    return rows


def read_metrics(path: Path) -> list[dict]:
    """Evaluation rows of a metrics.jsonl (or of the run directory holding one); null -> NaN."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    return [{k: _nan_for_null(v) for k, v in row.items()} for row in read_jsonl(path)]


def evaluation_rounds(rows: list[dict]) -> list[list[dict]]:
    """Rows grouped into evaluation rounds, in order.

    Members of one round share `eval_index`; rows without one are grouped by equal `env_steps`.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = ("eval", row["eval_index"]) if "eval_index" in row else ("steps", row["env_steps"])
        groups.setdefault(key, []).append(row)
    return sorted(
        groups.values(),
        key=lambda group: (max(r["env_steps"] for r in group), max(r["wall_time"] for r in group)),
    )


def summarize(rows: list[dict]) -> dict:
    """Headline numbers of a run: the best member at the last evaluation round and totals."""
    if not rows:
        raise ValueError("no evaluation rows to summarize")
    rounds = evaluation_rounds(rows)
    last_round = rounds[-1]
    best = max(
        (r for r in last_round if is_number(r["return_mean"])),
        key=lambda r: r["return_mean"],
        default=None,
    )
    last_by_member, best_by_member = last_and_best(rounds, "member")
    return {
        "best_member": None if best is None else int(best["member"]),
        "best_return": math.nan if best is None else float(best["return_mean"]),
        "best_hparams": None if best is None else best["hparams"],
        "median_return": median(finite_returns(last_round)),
        "member_returns": {m: float(r["return_mean"]) for m, r in sorted(last_by_member.items())},
        # Members (their configurations) from best to worst at their last evaluation.
        "ranking": [
            {
                "member": int(r["member"]),
                "final_return": float(r["return_mean"]),
                "best_return": best_by_member.get(int(r["member"]), math.nan),
                "hparams": r["hparams"],
            }
            for r in best_first(last_by_member.values())
        ],
        "evaluations": len(rounds),
        "env_steps": max(int(r["env_steps"]) for r in rows),
        "wall_time": max(float(r["wall_time"]) for r in rows),
        **({"trials": rank_trials(rounds)} if any("trial" in r for r in rows) else {}),
    }

"""The members of one or several runs as learning curves, grouped for aggregate statistics.

Each member of a run is one trained agent ("a run" in the statistics of `aggregate.py`).
`load_groups` reads run directories and groups their members either by configuration
(`members.json`'s `config_index`: configuration c of every run together, one stratum per run
directory) or by run (one group per directory, one stratum per configuration in it). Scores on
a common grid are step functions: at time t, each member's latest finite evaluation taken by t.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastpop.analysis.plot import (
    config_value,
    ran_minutes,
    read_run_config,
    read_run_rows,
    run_label,
)
from fastpop.run.run_files import MEMBERS_FILE

GROUP_BY = ("configuration", "run")


@dataclass(frozen=True)
class MemberCurve:
    """One member's evaluations in time order, and where it belongs."""

    run: str  # its run's label
    member: int
    config_index: int
    config_label: str  # the hparams that differ between the run's configurations
    env_id: str | None
    wall_minutes: np.ndarray
    member_env_steps: np.ndarray
    returns: np.ndarray  # NaN where the member had diverged
    ran_minutes: float  # how long its run ran

    def finite(self, x_field: str) -> tuple[np.ndarray, np.ndarray]:
        keep = np.isfinite(self.returns)
        return getattr(self, x_field)[keep], self.returns[keep]


@dataclass(frozen=True)
class Group:
    """Members whose returns are aggregated together; `strata[i]` is member i's stratum."""

    label: str
    members: tuple[MemberCurve, ...]
    strata: np.ndarray

    def grid(self, x_field: str) -> np.ndarray:
        """Evaluation points (of any member) from where every member has a finite evaluation to
        the earliest last evaluation: the span where every member has a score."""
        series = [member.finite(x_field)[0] for member in self.members]
        start, stop = max(s[0] for s in series), min(s[-1] for s in series)
        if start > stop:
            raise ValueError(
                f"{self.label}: no {x_field} at which every member has an evaluation (one "
                f"member's last is at {stop:g}, another's first at {start:g}); aggregate runs "
                "that overlap in time"
            )
        points = np.unique(np.concatenate(series))
        return points[(points >= start) & (points <= stop)]

    def scores(self, x_field: str, points: np.ndarray) -> np.ndarray:
        """(len(points), members): each member's latest finite return by each point (NaN
        before its first one). A NaN evaluation, a diverged member the learner has since reset,
        keeps the member's previous finite return."""
        columns = []
        for member in self.members:
            x, returns = member.finite(x_field)
            taken = np.searchsorted(x, points, side="right") - 1
            columns.append(np.where(taken >= 0, returns[np.maximum(taken, 0)], math.nan))
        return np.stack(columns, axis=-1)

    @property
    def ran_minutes(self) -> float:
        return min(member.ran_minutes for member in self.members)


def _configurations(run_dir: Path, rows: list[dict]) -> dict[int, tuple[int, dict]]:
    """member -> (config index, initial hparams), from members.json; without one (or for runs
    written before members.json had config indices) members with equal initial hparams are one
    configuration, numbered in member order."""
    path = run_dir / MEMBERS_FILE
    if path.is_file():
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))["members"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not a fastpop members file ({error})") from None
        hparams = {int(entry["member"]): entry.get("hparams", {}) for entry in entries}
        if all("config_index" in entry for entry in entries):
            return {
                int(e["member"]): (int(e["config_index"]), hparams[int(e["member"])])
                for e in entries
            }
    else:
        hparams = {}
        for row in rows:
            hparams.setdefault(int(row["member"]), row.get("hparams", {}))
    keys: dict[str, int] = {}
    return {
        member: (keys.setdefault(json.dumps(values, sort_keys=True), len(keys)), values)
        for member, values in sorted(hparams.items())
    }


def _config_labels(configurations: dict[int, tuple[int, dict]]) -> dict[int, str]:
    """config index -> "name=value, ..." of the hparams that differ between configurations."""
    first: dict[int, dict] = {}
    for index, hparams in configurations.values():
        first.setdefault(index, hparams)
    names = sorted({name for hparams in first.values() for name in hparams})
    shown = lambda value: f"{value:.4g}" if isinstance(value, float) else str(value)
    varying = [n for n in names if len({shown(h.get(n)) for h in first.values()}) > 1]
    return {
        index: ", ".join(f"{n}={shown(hparams.get(n))}" for n in varying)
        for index, hparams in first.items()
    }


def load_member_curves(run_dir: Path) -> list[MemberCurve]:
    """Every member of one run directory, with its evaluations and configuration."""
    run_dir = Path(run_dir)
    rows = read_run_rows(run_dir, "nothing to aggregate")
    config = read_run_config(run_dir)
    configurations = _configurations(run_dir, rows)
    labels = _config_labels(configurations)
    by_member: dict[int, list[dict]] = {}
    for row in rows:
        by_member.setdefault(int(row["member"]), []).append(row)
    curves = []
    for member, member_rows in sorted(by_member.items()):
        member_rows.sort(key=lambda row: (row["wall_time"], row["member_env_steps"]))
        if member not in configurations:
            raise ValueError(f"{run_dir / MEMBERS_FILE}: has no entry for member {member}")
        index = configurations[member][0]
        column = lambda name, rows=member_rows: np.array([float(r[name]) for r in rows])
        trials = list(dict.fromkeys(r["trial"] for r in member_rows if "trial" in r))
        # A halving slot ran several trials, one after another: its curve is the slot's.
        label = f"trials {', '.join(map(str, trials))}" if trials else labels[index]
        curves.append(
            MemberCurve(
                run=run_label(run_dir, config),
                member=member,
                config_index=index,
                config_label=label,
                env_id=config_value(config, "env.id"),
                wall_minutes=column("wall_time") / 60,
                member_env_steps=column("member_env_steps"),
                returns=column("return_mean"),
                ran_minutes=ran_minutes(run_dir, rows),
            )
        )
    return curves


def _group_by_configuration(runs: list[list[MemberCurve]]) -> list[Group]:
    labels: dict[int, tuple[str, str]] = {}  # config index -> (its label, the run it came from)
    members: dict[int, list[MemberCurve]] = {}
    strata: dict[int, list[int]] = {}
    for run_number, curves in enumerate(runs):
        for curve in curves:
            index = curve.config_index
            label, first_run = labels.setdefault(index, (curve.config_label, curve.run))
            if curve.config_label != label:
                raise ValueError(
                    f"configuration {index} is {label or 'the only one'} in {first_run} but "
                    f"{curve.config_label or 'the only one'} in {curve.run}: --by configuration "
                    "pools configuration i of every run, so the runs must be one sweep (the "
                    "same grid or priors and seed) on other envs or seeds; compare different "
                    "runs with --by run"
                )
            members.setdefault(index, []).append(curve)
            strata.setdefault(index, []).append(run_number)
    return [
        Group(
            f"config {index}" + (f": {labels[index][0]}" if labels[index][0] else ""),
            tuple(members[index]),
            np.array(strata[index]),
        )
        for index in sorted(members)
    ]


def run_strata(curves) -> np.ndarray:
    """Strata of one run's members: its configurations when each has seeds to resample, else
    one stratum (a run of single-seed configurations, random search or PBT, is one sample of
    members: resampling each within itself would give zero-width intervals)."""
    strata = np.array([c.config_index for c in curves])
    if np.unique(strata, return_counts=True)[1].min() < 2:
        return np.zeros_like(strata)
    return strata


def load_groups(run_dirs: list[Path], by: str = "configuration") -> list[Group]:
    """The members of `run_dirs` grouped `by` configuration or by run (see the module)."""
    if by not in GROUP_BY:
        raise ValueError(f"group by {by!r}: choose from {', '.join(GROUP_BY)}")
    if not run_dirs:
        raise ValueError("aggregate: no run directories given")
    runs = [load_member_curves(Path(d)) for d in run_dirs]
    if by == "run":
        groups = [Group(curves[0].run, tuple(curves), run_strata(curves)) for curves in runs]
    else:
        groups = _group_by_configuration(runs)
    for group in groups:
        envs = sorted({str(member.env_id) for member in group.members})
        if len(envs) > 1:
            warnings.warn(
                f"{group.label} pools the raw returns of {', '.join(envs)}; returns are not "
                "normalized across environments, so its statistics mix their scales",
                stacklevel=2,
            )
        if not all(np.isfinite(member.returns).any() for member in group.members):
            raise ValueError(f"{group.label}: a member has no finite evaluation return yet")
    return groups

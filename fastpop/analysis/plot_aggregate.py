"""`fastpop plot --aggregate`: what a sweep says once seeds are accounted for.

For each group of members (a configuration across runs, or a whole run; `fastpop.analysis.sweep`):
  aggregate_walltime_vs_return.png  IQM and mean return against wall-clock minutes
  aggregate_steps_vs_return.png     the same against env steps per member
  performance_profile.png           fraction of members above each return, at the latest
                                    minute every group reached
each with 95% stratified bootstrap confidence bands (`aggregate.py`), and with `--table`
a markdown table of IQM, mean, median and optimality gap with their intervals at chosen minutes.
A curve spans the time where every member of its group has an evaluation (its shortest run).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastpop.analysis import aggregate
from fastpop.analysis.plot import default_minutes, default_out_dir
from fastpop.analysis.sweep import Group, load_groups

if TYPE_CHECKING:
    from matplotlib.figure import Figure

AGGREGATE_WALLTIME_PLOT = "aggregate_walltime_vs_return.png"
AGGREGATE_STEPS_PLOT = "aggregate_steps_vs_return.png"
PROFILE_PLOT = "performance_profile.png"
PROFILE_THRESHOLDS = 101
CURVE_STATISTICS = (("iqm", "IQM"), ("mean", "mean"))
TABLE_STATISTICS = (("iqm", "IQM"), ("mean", "mean"), ("median", "median"))
TABLE_STATISTICS += (("optimality_gap", "optimality gap"),)
X_AXES = {
    "wall_minutes": "wall-clock time (minutes, compilation included)",
    "member_env_steps": "environment steps per member",
}


def default_gamma(groups: list[Group]) -> float:
    """The optimality gap's target when none is given: the best return any member reached."""
    return max(float(np.nanmax(m.returns)) for g in groups for m in g.members)


def estimate(
    group: Group, scores: np.ndarray, name: str, gamma: float, seed: int = 0
) -> aggregate.Estimate:
    """One statistic of `scores` (..., members) with its stratified bootstrap interval."""
    statistic = aggregate.statistics(gamma)[name]
    return aggregate.interval_estimates(scores, group.strata, statistic, seed=seed)


def _new_figure(columns: int) -> tuple[Figure, list]:
    # Imported here, as in fastpop.analysis.plot: `fastpop train` imports this module.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6 * columns, 4.5), dpi=120)
    FigureCanvasAgg(figure)
    return figure, [figure.add_subplot(1, columns, c + 1) for c in range(columns)]


def _plot_curves(groups: list[Group], x_field: str, gamma: float, path: Path) -> None:
    figure, axes = _new_figure(len(CURVE_STATISTICS))
    for index, group in enumerate(groups):
        points = group.grid(x_field)
        scores = group.scores(x_field, points)
        for ax, (name, title) in zip(axes, CURVE_STATISTICS, strict=True):
            value = estimate(group, scores, name, gamma)
            colour = f"C{index % 10}"
            label = f"{group.label} ({len(group.members)})"
            ax.plot(points, value.point, color=colour, drawstyle="steps-post", label=label)
            ax.fill_between(points, value.low, value.high, color=colour, alpha=0.2, step="post")
            ax.set_title(f"{title} return, 95% stratified bootstrap CI")
    for ax in axes:
        ax.set_xlabel(X_AXES[x_field])
        ax.set_ylabel("evaluation return")
        ax.grid(True, alpha=0.3)
    axes[0].legend(loc="best", fontsize="small", title="group (members)")
    figure.tight_layout()
    figure.savefig(path)


def profile_minute(groups: list[Group]) -> float:
    """The latest minute at which every member of every group has an evaluation."""
    return min(group.grid("wall_minutes")[-1] for group in groups)


def _plot_profiles(groups: list[Group], path: Path) -> None:
    minute = profile_minute(groups)
    finals = [g.scores("wall_minutes", np.array([minute]))[0] for g in groups]
    every = np.concatenate(finals)
    thresholds = np.linspace(every.min(), every.max(), PROFILE_THRESHOLDS)
    figure, (ax,) = _new_figure(1)
    for index, (group, scores) in enumerate(zip(groups, finals, strict=True)):
        statistic = lambda s: aggregate.performance_profile(s, thresholds)
        value = aggregate.interval_estimates(scores, group.strata, statistic)
        colour = f"C{index % 10}"
        ax.plot(thresholds, value.point, color=colour, label=f"{group.label} ({len(scores)})")
        ax.fill_between(thresholds, value.low, value.high, color=colour, alpha=0.2)
    ax.set_xlabel("return threshold")
    ax.set_ylabel("fraction of members with a higher return")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"Performance profile at {minute:.1f} min (95% stratified bootstrap CI)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small", title="group (members)")
    figure.tight_layout()
    figure.savefig(path)


def plot_aggregate(
    run_dirs: list[Path],
    out_dir: Path | None = None,
    by: str = "configuration",
    gamma: float | None = None,
) -> list[Path]:
    """Write the aggregate curves and the performance profile of `run_dirs`; their paths."""
    run_dirs = [Path(d) for d in run_dirs]
    groups = load_groups(run_dirs, by)
    gamma = default_gamma(groups) if gamma is None else gamma
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(run_dirs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / name for name in (AGGREGATE_WALLTIME_PLOT, AGGREGATE_STEPS_PLOT)]
    _plot_curves(groups, "wall_minutes", gamma, paths[0])
    _plot_curves(groups, "member_env_steps", gamma, paths[1])
    paths.append(out_dir / PROFILE_PLOT)
    _plot_profiles(groups, paths[-1])
    return paths


def _cells(group: Group, minute: float, gamma: float) -> list[str]:
    """The table cells of one group at one minute (point [low, high] per statistic)."""
    if minute > group.ran_minutes:
        return [f"ran {group.ran_minutes:.1f} min"] + [""] * (len(TABLE_STATISTICS) - 1)
    scores = group.scores("wall_minutes", np.array([minute]))[0]
    if np.isnan(scores).any():
        return ["no evaluation yet"] + [""] * (len(TABLE_STATISTICS) - 1)
    cells = []
    for name, _ in TABLE_STATISTICS:
        value = estimate(group, scores, name, gamma)
        cells.append(f"{value.point:.0f} [{value.low:.0f}, {value.high:.0f}]")
    return cells


def aggregate_table(
    run_dirs: list[Path],
    minutes: tuple[float, ...] | None = None,
    by: str = "configuration",
    gamma: float | None = None,
) -> str:
    """Markdown: per group and minute, IQM, mean, median and optimality gap of the members'
    latest evaluation by then, each with its 95% stratified bootstrap interval. Without
    `minutes`: quarters of the longest group's run (`plot.default_minutes`)."""
    groups = load_groups([Path(d) for d in run_dirs], by)
    if minutes is None:
        minutes = default_minutes([group.ran_minutes for group in groups])
    given = gamma is not None
    gamma = gamma if given else default_gamma(groups)
    strata = "runs" if by == "configuration" else "configurations"
    lines = [
        f"Members' latest evaluation return by each minute; [95% stratified bootstrap CI, "
        f"{aggregate.REPETITIONS} resamples, strata: {strata}]; optimality gap below "
        f"gamma = {gamma:.6g} ({'--gamma' if given else 'the best return reached; set --gamma'})",
        "",
        "| group | minute | members | " + " | ".join(t for _, t in TABLE_STATISTICS) + " |",
        "|---|---:|---:|" + "---:|" * len(TABLE_STATISTICS),
    ]
    for group in groups:
        for minute in minutes:
            cells = _cells(group, minute, gamma)
            row = [group.label, f"{minute:g}", str(len(group.members)), *cells]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)

"""Learning curves of one or several runs: return against wall-clock time and against env steps.

Each run gets one colour; the solid line is the best member's evaluation return at each round
(max over members), the dashed line the population median. Wall time includes compilation and
collection, so the walltime plot is the honest speed comparison the paper makes.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from fastpop.run.run_files import (
    METRICS_FILE,
    evaluation_rounds,
    finite_returns,
    median,
    read_metrics,
)

WALLTIME_PLOT = "walltime_vs_return.png"
STEPS_PLOT = "steps_vs_return.png"


@dataclass(frozen=True)
class Curve:
    """Per evaluation round of one run: when it completed and its best / median return."""

    label: str
    wall_minutes: list[float]
    env_steps: list[int]
    best_return: list[float]
    median_return: list[float]
    # The return of the strategy's mean member (`StrategyEntry.mean_member`: cemrl's member 0,
    # which acts with the CEM mean) per round, and its legend; else empty.
    mean_member_return: tuple[float, ...] = ()
    mean_legend: str = ""
    # How long the run ran (or has run so far): past it, a table has no value to show.
    ran_minutes: float = math.inf


def read_run_config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    try:
        import yaml

        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as error:  # the label is cosmetic: a bad config must not stop a plot
        warnings.warn(f"{path}: not read ({error}); labelling the run by its name", stacklevel=3)
        return {}
    return config if isinstance(config, dict) else {}


def read_run_rows(run_dir: Path, empty: str) -> list[dict]:
    """The evaluation rows of one run directory; ValueError naming what is missing (`empty`:
    what the caller cannot do without rows)."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no metrics file; is {run_dir} a fastpop run directory?")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no evaluation rows yet; {empty}")
    return rows


def config_value(config: dict, *paths: str):
    for dotted in paths:
        value = config
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, str | int) and not isinstance(value, bool):
            return value
    return None


def run_label(run_dir: Path, config: dict) -> str:
    """The directory name, plus algorithm / env / population size when the config has them."""
    from fastpop.strategies import registry

    strategy = config_value(config, "strategy")
    details = [
        config_value(config, "algo", "algorithm", "agent.algorithm", "agent.name", "agent"),
        config_value(config, "env.id", "env.name", "env"),
        None if strategy == registry.DEFAULT else strategy,  # the default goes without saying
    ]
    size = config_value(config, "population.size", "population_size")
    if size is not None:
        details.append(f"P={size}")
    details = [str(d) for d in details if d is not None]
    return f"{run_dir.name} ({', '.join(details)})" if details else run_dir.name


def ran_minutes(run_dir: Path, rows: list[dict]) -> float:
    """Wall-clock minutes the run ran: summary.json's wall time (written when a run stops, a
    little past its last evaluation) or, while it runs or after a crash, its last evaluation's."""
    last = max((float(row["wall_time"]) for row in rows), default=0.0)
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
        last = max(last, float(summary["wall_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no summary (yet): the metrics say how far the run got
    return last / 60


def default_minutes(ran: list[float]) -> tuple[float, ...]:
    """--table's minutes when none are given: a quarter, half, three quarters and all of the
    longest run's length, rounded down to two significant digits (so each lies inside it)."""
    longest = max((m for m in ran if math.isfinite(m)), default=0.0)
    if longest <= 0:
        return (0.0,)
    digits = 1 - math.floor(math.log10(longest))  # two significant digits

    def round_down(minute: float) -> float:
        return math.floor(minute * 10**digits) / 10**digits

    return tuple(sorted({round_down(longest * quarter / 4) for quarter in (1, 2, 3, 4)}))


def load_curve(run_dir: Path) -> Curve:
    """Best and median return per evaluation round of one run directory."""
    run_dir = Path(run_dir)
    rows = read_run_rows(run_dir, "nothing to plot")
    rounds = evaluation_rounds(rows)
    best, medians = [], []
    for group in rounds:
        returns = finite_returns(group)
        best.append(max(returns) if returns else math.nan)
        medians.append(median(returns))
    config = read_run_config(run_dir)
    from fastpop.strategies import registry

    entry = registry.find(config.get("strategy"))
    mean, legend = (), ""
    if entry is not None and entry.mean_member is not None:
        mean = tuple(
            next(
                (r["return_mean"] for r in group if r["member"] == entry.mean_member.index),
                math.nan,
            )
            for group in rounds
        )
        legend = f"{entry.mean_member.label} (member {entry.mean_member.index})"
    return Curve(
        mean_member_return=mean,
        mean_legend=legend,
        label=run_label(run_dir, config),
        wall_minutes=[max(r["wall_time"] for r in group) / 60 for group in rounds],
        env_steps=[max(r["env_steps"] for r in group) for group in rounds],
        best_return=best,
        median_return=medians,
        ran_minutes=ran_minutes(run_dir, rows),
    )


def default_out_dir(run_dirs: list[Path]) -> Path:
    if len(run_dirs) == 1:
        return run_dirs[0]
    names = [re.sub(r"[^A-Za-z0-9._-]+", "-", d.resolve().name) for d in run_dirs]
    joined = "_".join(names)
    if len(joined) > 80:
        joined = f"{'_'.join(names[:2])}_and_{len(names) - 2}_more"
    return run_dirs[0].resolve().parent / f"comparison_{joined}"


def _plot(curves: list[Curve], x_field: str, xlabel: str, title: str, path: Path) -> None:
    # Imported here: `fastpop train` imports this module for the plots' names, and matplotlib
    # cost every run ~0.4 s of start-up on a 2-core CPU.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    figure = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, curve in enumerate(curves):
        colour = f"C{index % 10}"
        x = getattr(curve, x_field)
        axes.plot(x, curve.best_return, color=colour, marker="o", markersize=3, label=curve.label)
        axes.plot(x, curve.median_return, color=colour, linestyle="--", alpha=0.8)
        if curve.mean_member_return:
            axes.plot(x, curve.mean_member_return, color=colour, linestyle=":", alpha=0.9)
    style = [
        Line2D([], [], color="black", label="best member"),
        Line2D([], [], color="black", linestyle="--", label="population median"),
    ]
    for legend in dict.fromkeys(curve.mean_legend for curve in curves if curve.mean_member_return):
        style.append(Line2D([], [], color="black", linestyle=":", label=legend))
    handles, _ = axes.get_legend_handles_labels()
    axes.legend(handles=handles + style, loc="best", fontsize="small")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("evaluation return")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def plot_runs(run_dirs: list[Path], out_dir: Path | None = None) -> list[Path]:
    """Write walltime_vs_return.png and steps_vs_return.png comparing `run_dirs`.

    `out_dir` defaults to the run's own directory for one run, and to
    `<parent of the first run>/comparison_<names>` for several. Returns the written paths.
    """
    run_dirs = [Path(d) for d in run_dirs]
    if not run_dirs:
        raise ValueError("plot_runs: no run directories given")
    curves = [load_curve(d) for d in run_dirs]
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(run_dirs)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / WALLTIME_PLOT, out_dir / STEPS_PLOT]
    _plot(
        curves,
        "wall_minutes",
        "wall-clock time (minutes, compilation included)",
        "Evaluation return vs wall-clock time",
        paths[0],
    )
    _plot(
        curves,
        "env_steps",
        "environment steps (whole population)",
        "Evaluation return vs environment steps",
        paths[1],
    )
    return paths


def returns_by_minute(curve: Curve, minutes: float) -> tuple[float, float]:
    """(best member's return at the last evaluation taken by `minutes`, best return of any
    evaluation taken by then); NaN before the first evaluation."""
    taken = [i for i, m in enumerate(curve.wall_minutes) if m <= minutes]
    if not taken:
        return math.nan, math.nan
    so_far = [curve.best_return[i] for i in taken if math.isfinite(curve.best_return[i])]
    return curve.best_return[taken[-1]], max(so_far, default=math.nan)


def returns_table(run_dirs: list[Path], minutes: tuple[float, ...] | None = None) -> str:
    """A markdown table: per run, the best member's return at the last evaluation snapshot taken
    by each wall-clock minute (in brackets: the best of any snapshot by then). A minute past the
    run's end shows how long it ran instead ("ran 15.0 min"), not its final values as if it had
    run that long. Without `minutes`: `default_minutes` of the runs."""
    curves = [load_curve(Path(run_dir)) for run_dir in run_dirs]
    if minutes is None:
        minutes = default_minutes([curve.ran_minutes for curve in curves])
    header = "| run | " + " | ".join(f"{m:g} min" for m in minutes) + " |"
    lines = [header, "|---|" + "---:|" * len(minutes)]
    for curve in curves:
        cells = []
        for m in minutes:
            latest, best = returns_by_minute(curve, m)
            if m > curve.ran_minutes:
                cells.append(f"ran {curve.ran_minutes:.1f} min")
            else:
                cells.append("-" if math.isnan(latest) else f"{latest:.0f} ({best:.0f})")
        lines.append(f"| {curve.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

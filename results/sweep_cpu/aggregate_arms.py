"""`fastpop plot --aggregate --by run --table` with one stratum per run instead of one per
configuration: each arm's members are resampled as one pool.

Why: `fastpop plot --aggregate --by run` stratifies a run's members by configuration
(members.json's config_index). In a random search or a PBT run every member is its own
configuration (seeds = 1), so every stratum holds one member, every bootstrap resample is the
data itself and the "95% CI" has zero width (see README.md, "The stock `fastpop plot
--aggregate --by run` (bug: zero-width intervals)"). Here
the groups are the same (`analysis.sweep.load_groups(..., by="run")`), only the strata change,
and the figures and table are drawn by fastpop's own plotting and table code
(`fastpop.analysis.plot_aggregate`), so the numbers are comparable with the stock tool's.

    python results/sweep_cpu/aggregate_arms.py RUN [RUN ...] --out DIR --minutes 1,2,3,4 [--gamma G]

writes DIR/aggregate_walltime_vs_return.png, aggregate_steps_vs_return.png,
performance_profile.png and prints the markdown table.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from fastpop.analysis import aggregate, plot_aggregate
from fastpop.analysis.sweep import load_groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", default="1,2,3,4")
    parser.add_argument("--gamma", type=float, default=None)
    args = parser.parse_args()
    minutes = tuple(float(m) for m in args.minutes.split(","))

    groups = [
        dataclasses.replace(group, strata=np.zeros(len(group.members), int))
        for group in load_groups(args.runs, by="run")
    ]
    given = args.gamma is not None
    gamma = args.gamma if given else plot_aggregate.default_gamma(groups)
    args.out.mkdir(parents=True, exist_ok=True)
    plot_aggregate._plot_curves(
        groups, "wall_minutes", gamma, args.out / plot_aggregate.AGGREGATE_WALLTIME_PLOT
    )
    plot_aggregate._plot_curves(
        groups, "member_env_steps", gamma, args.out / plot_aggregate.AGGREGATE_STEPS_PLOT
    )
    plot_aggregate._plot_profiles(groups, args.out / plot_aggregate.PROFILE_PLOT)

    statistics = plot_aggregate.TABLE_STATISTICS
    print(
        f"Members' latest evaluation return by each minute; [95% bootstrap CI, "
        f"{aggregate.REPETITIONS} resamples of each run's members as one stratum]; optimality "
        f"gap below gamma = {gamma:.6g} ({'--gamma' if given else 'the best return reached'})"
    )
    print()
    print("| group | minute | members | " + " | ".join(t for _, t in statistics) + " |")
    print("|---|---:|---:|" + "---:|" * len(statistics))
    for group in groups:
        for minute in minutes:
            cells = plot_aggregate._cells(group, minute, gamma)
            print(
                "| "
                + " | ".join([group.label, f"{minute:g}", str(len(group.members)), *cells])
                + " |"
            )
    minute = plot_aggregate.profile_minute(groups)
    print()
    print(
        f"Performance profile drawn at {minute:.2f} min (the latest minute every member of "
        "every group has an evaluation)."
    )


if __name__ == "__main__":
    main()

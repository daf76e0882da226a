"""The report of `fastpop bench device`: one Markdown table row per (P, E), the table, and the
JSON and PNG files (results/bench/device_<env>_<device>.*)."""

from __future__ import annotations

from pathlib import Path

from fastpop.bench.common import two_panel_figure, write_json


def table_row(row: dict) -> str:
    """One Markdown table row (`TABLE_HEADER`)."""
    r, c = row["ratios"], row["compile_seconds"]
    cells = [
        row["population"],
        row["envs_per_member"],
        f"{row['fused']['env_steps_per_s']:,.0f}",
        f"{row['fused']['agent_updates_per_s']:,.0f}",
        f"{row['env_alone']['env_steps_per_s']:,.0f}",
        f"{r['fused_env_steps_vs_env_alone']:.3f}",
        f"{row['collect_alone']['env_steps_per_s']:,.0f}",
        f"{row['update_alone']['agent_updates_per_s']:,.0f}",
        f"{r['fused_updates_vs_update_alone']:.2f}",
        f"{r['fused_vs_serial_sum']:.2f}",
        f"{c['fused']:.1f}, {c['rollout']:.1f}, {c['env']:.1f}",
    ]
    if "process_mode" in row:  # the counterpart's env-steps/s in process mode, and fused's ratio
        process = row["process_mode"]["env_steps_per_s"]
        cells += [f"{process:,.0f}", f"{r['fused_env_steps_vs_process_mode']:.2f}"]
    else:
        cells += ["-", "-"]
    return "| " + " | ".join(map(str, cells)) + " |"


TABLE_HEADER = (
    "| P | E | fused env-steps/s | fused agent-updates/s | env alone env-steps/s | "
    "fused / env alone | collect alone env-steps/s | update alone agent-updates/s | "
    "fused / update alone | fused / serial sum | compile fused, rollout, env (s) | "
    "process mode env-steps/s | fused / process mode |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
)


def table(result: dict) -> str:
    """The result as a Markdown table (what the README records)."""
    return "\n".join([TABLE_HEADER, *map(table_row, result["rows"])])


def write_results(result: dict, out_dir: Path) -> tuple[Path, Path]:
    """JSON and PNG (env-steps/s and agent-updates/s against P, one line per E)."""
    stem = f"device_{result['env'].replace('/', '_')}_{result['device']}"
    json_path = write_json(result, out_dir / f"{stem}.json")
    fig, (env_ax, update_ax) = two_panel_figure(11)
    series = (  # one color per measurement, one line style per E
        (env_ax, "fused", "env_steps_per_s", "C0"),
        (env_ax, "env_alone", "env_steps_per_s", "C1"),
        (env_ax, "collect_alone", "env_steps_per_s", "C2"),
        (update_ax, "fused", "agent_updates_per_s", "C0"),
        (update_ax, "update_alone", "agent_updates_per_s", "C3"),
        (env_ax, "process_mode", "env_steps_per_s", "C4"),
        (update_ax, "process_mode", "agent_updates_per_s", "C4"),
    )
    for index, per_member in enumerate(dict.fromkeys(r["envs_per_member"] for r in result["rows"])):
        rows = [r for r in result["rows"] if r["envs_per_member"] == per_member]
        sizes, style = [r["population"] for r in rows], ("-o", "--s", ":^", "-.v")[index % 4]
        for ax, what, key, color in series:
            if what not in rows[0]:
                continue
            name = f"process mode ({result['process_env']})" if what == "process_mode" else what
            label = f"{name.replace('_', ' ')}, E={per_member}"
            ax.plot(sizes, [r[what][key] for r in rows], style, color=color, label=label)
    for ax, label in ((env_ax, "env steps / s"), (update_ax, "agent updates / s")):
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="population size P", ylabel=label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    backend = f" ({result['backend']})" if result["backend"] else ""
    fig.suptitle(
        f"device mode: {result['env']}{backend}, {result['algo'].upper()} on {result['device']}"
    )
    fig.tight_layout()
    png_path = out_dir / f"{stem}.png"
    fig.savefig(png_path, dpi=100)
    return json_path, png_path

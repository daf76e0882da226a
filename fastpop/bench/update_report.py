"""What `fastpop bench update` shows and writes: each row on the console (its rate, and what
bounds it where that was read), and the JSON table and PNG figure of a result.
"""

from __future__ import annotations

from pathlib import Path

from fastpop.bench import floors, kernel_times
from fastpop.bench.common import two_panel_figure, write_json


def row_lines(algo: str, row: dict, steps: int) -> list[str]:
    """What the console shows of a row: its rate, and what bounds it where that was read."""
    lines = [row_line(algo, row)]
    if "times_floor" in row:
        lines.append(floors.floor_line(algo, row))
    if "kernel_times" in row:
        lines.append(kernel_times.kernel_line(algo, row, steps))
    elif "kernel_times_error" in row:
        name = f"{algo} {row['impl']} P={row['population']}"
        lines.append(f"{name}: no kernel times: {row['kernel_times_error']}")
    return lines


def row_line(algo: str, row: dict) -> str:
    """A JAX implementation's row as the console shows it."""
    line = (
        f"{algo} {row['impl']:10s} P={row['population']:3d}  "
        f"{row['agent_updates_per_s']:9.1f} agent-updates/s  {row['gflops_per_s']:7.1f} GFLOP/s  "
        f"compile {row['compile_seconds']:.1f} s"
    )
    if "members_per_chunk" in row:
        line += f"  chunks of {row['members_per_chunk']} ({row['how_chunked']})"
    if row.get("seconds_per_kernel"):
        line += (
            f"  {row['kernels_per_update_step']:.0f} kernels per update step, "
            f"{1e6 * row['seconds_per_kernel']:.1f} us each"
        )
    return line


def write_results(result: dict, out_dir: Path) -> tuple[Path, Path]:
    """JSON table and PNG (updates/s and speedup over sequential against population size)."""
    stem = f"update_{result['algo']}_{result['device']}"
    json_path = write_json(result, out_dir / f"{stem}.json")
    fig, (rate_ax, speed_ax) = two_panel_figure(10)
    for impl in dict.fromkeys(r["impl"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["impl"] == impl]
        sizes = [r["population"] for r in rows]
        rate_ax.plot(sizes, [r["agent_updates_per_s"] for r in rows], marker="o", label=impl)
        speedups = [r["speedup_over_best_sequential"] for r in rows]
        if all(speedups):
            speed_ax.plot(sizes, speedups, marker="o", label=impl)
    axes = ((rate_ax, "agent updates / s"), (speed_ax, "speedup over the best sequential JAX"))
    for ax, label in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("population size")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (no speedup line without a sequential row)
            ax.legend()
    fig.suptitle(
        f"{result['algo'].upper()} update step on {result['device']} "
        f"(large matmul: {result['matmul_gflops_per_s']:.0f} GFLOP/s)"
    )
    fig.tight_layout()
    png_path = out_dir / f"{stem}.png"
    fig.savefig(png_path, dpi=100)
    return json_path, png_path

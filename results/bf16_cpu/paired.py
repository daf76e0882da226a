"""Each seed's final evaluation return in both arms of results/bf16_cpu/compare.sh, side by
side (a seed is the same member index in both runs: the same init, env and noise keys).

    python results/bf16_cpu/paired.py results/bf16_cpu/runs/td3-64
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def final_returns(run: Path) -> np.ndarray:
    returns = json.loads((run / "summary.json").read_text())["final_evaluation"]["member_returns"]
    return np.array([returns[str(member)] for member in range(len(returns))])


def main(runs: Path) -> None:
    f32, bf16 = final_returns(runs / "float32"), final_returns(runs / "bfloat16")
    print("| seed | float32 | bfloat16 | difference |\n|---:|---:|---:|---:|")
    for seed, (a, b) in enumerate(zip(f32, bf16, strict=True)):
        print(f"| {seed} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
    difference = bf16 - f32
    print(
        f"| mean | {f32.mean():.1f} | {bf16.mean():.1f} | {difference.mean():+.1f} "
        f"(largest {np.abs(difference).max():.1f}) |"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))

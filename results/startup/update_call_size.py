"""A preset trained for a fixed wall time with each of several `train.updates_per_call`, in
alternation over one compilation cache warmed first: seconds to the first progress line showing
updates, and the env steps and updates per member the run made (its summary.json).

    python results/startup/update_call_size.py --preset dqn_pbt_pong_cpu --sizes 10 50 \
        --seconds 90 --rounds 2

Another checkout: --code <its root>.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure import LINE  # the progress line as measure.py (beside this script) reads it

ROOT = Path(__file__).resolve().parents[2]


def train(code: Path, preset: str, size: int, seconds: float, cache: Path, out: Path) -> dict:
    """One run: seconds to its first progress line with updates, and its summary's counts."""
    command = [
        sys.executable, "-m", "fastpop", "train", str(ROOT / "configs" / f"{preset}.yaml"),
        "--out", str(out), "--set", f"train.max_wall_seconds={seconds:g}",
        "--set", f"train.updates_per_call={size}", "--set", "log.progress_interval_seconds=0.2",
    ]  # fmt: skip
    env = {**os.environ, "FASTPOP_CACHE_DIR": str(cache), "PYTHONPATH": str(code)}
    start, first_update = time.perf_counter(), None
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:  # fmt: skip
        for line in process.stdout:
            found = LINE.search(line)
            if first_update is None and found and found.group(2) != "0":
                first_update = time.perf_counter() - start
    summary = json.loads((out / "summary.json").read_text())
    return {
        "updates_per_call": size,
        "first_update_s": first_update,
        "member_env_steps": summary["member_env_steps"],
        "updates_per_member": summary["updates_per_member"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="dqn_pbt_pong_cpu")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--code", type=Path, default=ROOT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastpop-call-size-") as folder:
        work = Path(folder)
        train(args.code, args.preset, args.sizes[0], 20, work / "cache", work / "warming")
        print("| updates per call | first update s | env steps per member | updates per member |")
        print("| --- | --- | --- | --- |")
        for round_index in range(args.rounds):
            for size in args.sizes:
                out = work / f"run-{round_index}-{size}"
                row = train(args.code, args.preset, size, args.seconds, work / "cache", out)
                first = row["first_update_s"]
                first_text = "-" if first is None else f"{first:.1f}"
                print(
                    f"| {size} | {first_text} | {row['member_env_steps']:,} | "
                    f"{row['updates_per_member']:,} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

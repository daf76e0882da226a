"""A preset's first run on a machine that has not measured its members per chunk yet, for a
fixed wall time, with each of several code trees in alternation: the env steps and updates per
member it made (its summary.json) and the members per chunk it measured (its tuning.json).

Each run has a compilation cache of its own, filled first by a shorter run of the same tree
whose tuning.json is then removed: the runs compared differ in the measurement, not in
compiling.

    python results/startup/first_run.py --code /tmp/fastpop-before . --rounds 2

(--code: code trees, each the root of a checkout; each run starts in its tree's root.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train(code: Path, preset: str, seconds: float, cache: Path, out: Path) -> None:
    command = [
        sys.executable, "-m", "fastpop", "train", str(ROOT / "configs" / f"{preset}.yaml"),
        "--out", str(out), "--set", f"train.max_wall_seconds={seconds:g}",
    ]  # fmt: skip
    env = {**os.environ, "FASTPOP_CACHE_DIR": str(cache)}
    subprocess.run(command, env=env, cwd=code, check=True, capture_output=True)


def first_run(code: Path, preset: str, seconds: float, work: Path) -> dict:
    cache = work / "cache"
    train(code, preset, 40, cache, work / "filling")
    (cache / "tuning.json").unlink(missing_ok=True)
    train(code, preset, seconds, cache, work / "run")
    summary = json.loads((work / "run" / "summary.json").read_text())
    [choice] = json.loads((cache / "tuning.json").read_text()).values()
    return {
        "member_env_steps": summary["member_env_steps"],
        "updates_per_member": summary["updates_per_member"],
        "members_per_chunk": choice["members_per_chunk"],
        "time_vs_one_member": {c: round(r, 3) for c, r in choice["time_vs_one_member"].items()},
        "noisy": choice.get("noisy_measurements", 0) > 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT])
    parser.add_argument("--preset", default="td3_pbt_halfcheetah_cpu")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print("| code | env steps per member | updates per member | members per chunk (time vs 1) |")
    print("| --- | --- | --- | --- |")
    for _ in range(args.rounds):
        for code in args.code:
            with tempfile.TemporaryDirectory(prefix="fastpop-first-run-") as folder:
                row = first_run(code.resolve(), args.preset, args.seconds, Path(folder))
            noisy = ", rounds disagreed" if row["noisy"] else ""
            print(
                f"| {code} | {row['member_env_steps']:,} | {row['updates_per_member']:,} | "
                f"{row['members_per_chunk']} ({row['time_vs_one_member']}{noisy}) |",
                flush=True,
            )


if __name__ == "__main__":
    main()

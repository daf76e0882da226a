"""Peak memory (VmHWM, from /proc) of a run's spawned worker processes some seconds in: its
collectors, its evaluator and multiprocessing's resource tracker.

    python results/startup/worker_memory.py --code /tmp/fastpop-before2 --preset td3_halfcheetah_cpu
    python results/startup/worker_memory.py --preset td3_halfcheetah_cpu

(--code: the root of the checkout to run; the run starts there.) Linux only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spawned_workers() -> list[tuple[int, int]]:
    """(pid, peak MiB) of every process multiprocessing's spawn started on this machine."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile
            continue
        if "multiprocessing" in command:
            found.append((int(entry.name), int(status.split("VmHWM:")[1].split()[0]) // 1024))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--preset", default="td3_halfcheetah_cpu")
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastpop-worker-memory-") as folder:
        command = [
            sys.executable, "-m", "fastpop", "train", str(ROOT / "configs" / f"{args.preset}.yaml"),
            "--out", f"{folder}/run", "--set", f"train.max_wall_seconds={args.seconds + 30:g}",
        ]  # fmt: skip
        run = subprocess.Popen(
            command, cwd=args.code, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            time.sleep(args.seconds)
            workers = spawned_workers()
        finally:
            run.terminate()
            run.wait()
    print(f"{args.code} {args.preset}, {args.seconds:g} s in: peak MiB per spawned process")
    for pid, peak in workers:
        print(f"  pid {pid}: {peak} MiB")


if __name__ == "__main__":
    main()

"""Seconds from `fastpop train` starting to its first env step and its first update.

Each run is a fresh `python -m fastpop train` process; this script reads its progress lines
(printed every 0.1 s here) as they come and stamps them with its own clock, so the figures
include the interpreter's start and every import. A run is stopped (SIGTERM) as soon as it has
shown what was asked. The code measured is the checkout named by --code (default: this one), so
an older commit, unpacked with `git archive`, measures "before" with the same script:

    mkdir -p /tmp/fastpop-before && git archive <commit> | tar -x -C /tmp/fastpop-before
    python results/startup/measure.py --code /tmp/fastpop-before --label before --cache none
    python results/startup/measure.py --label after --cache cold-warm

--cache none: no persistent compilation cache (FASTPOP_COMPILE_CACHE=0, no
JAX_COMPILATION_CACHE_DIR); cold-warm: two runs over one fresh cache directory (the first fills
it, the second is the warm rerun); manual-cold-warm: the same with JAX_COMPILATION_CACHE_DIR set
by hand (what a user could do before fastpop set a cache itself). Every run gets a fresh
FASTPOP_CACHE_DIR, so no run sees this machine's own caches.

--entry console-script runs the `fastpop` script pip installed beside this Python (the README's
`fastpop train ...`) instead of `python -m fastpop`: a spawned worker runs a parent's main script
again unless it was started with `-m`, and that script imports the whole command line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"\]\s+([\d,]+) env steps .*?\|\s+([\d,]+) updates/member")
QUICK = ["log.progress_interval_seconds=0.1", "log.tensorboard=false"]
PRESETS = {
    "td3_pendulum_cpu": ("configs/td3_pendulum_cpu.yaml", [], "update"),
    "td3_brax_inverted_pendulum_cpu": ("configs/td3_brax_inverted_pendulum_cpu.yaml", [], "update"),
    "td3_gymnax_pendulum_cpu": ("configs/td3_gymnax_pendulum_cpu.yaml", [], "update"),
    # The paper's preset, to its first env step only; a smaller replay than its 300k per member
    # (24M rows, ~4 GB on a shared 24 GB machine), which the collectors' start-up does not wait for.
    "td3_pbt_halfcheetah": (
        "configs/td3_pbt_halfcheetah.yaml",
        ["replay.capacity=30000"],
        "env_step",
    ),
}
DEFAULT_PRESETS = list(PRESETS)
# Every other CPU preset, to its first update (which waits for its warm-up's env steps too).
PRESETS |= {
    path.stem: (f"configs/{path.name}", [], "update")
    for path in sorted((ROOT / "configs").glob("*_cpu.yaml"))
    if path.stem not in PRESETS
}


def entry_command(entry: str) -> list[str]:
    if entry == "module":
        return [sys.executable, "-m", "fastpop"]
    script = shutil.which("fastpop", path=str(Path(sys.executable).parent))
    if script is None:
        raise SystemExit(f"no fastpop script beside {sys.executable}: pip install -e .")
    return [sys.executable, script]


def measure_once(
    code: Path, preset: str, env: dict, out: Path, entry: str = "module", extra: tuple = ()
) -> dict:
    config, overrides, until = PRESETS[preset]
    sets = [arg for value in [*QUICK, *overrides, *extra] for arg in ("--set", value)]
    command = [*entry_command(entry), "train", str(ROOT / config), "--out", str(out)]
    start = time.monotonic()
    process = subprocess.Popen(
        [*command, *sets],
        cwd=out.parent,
        env=env | {"PYTHONPATH": str(code), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first_step = first_update = None
    tail: list[str] = []
    for line in process.stdout:
        tail = [*tail[-20:], line.rstrip()]
        if (match := LINE.search(line)) is None:
            continue
        now = time.monotonic() - start
        steps, updates = (int(group.replace(",", "")) for group in match.groups())
        if steps and first_step is None:
            first_step = now
        if updates and first_update is None:
            first_update = now
        if (until == "env_step" and first_step) or (until == "update" and first_update):
            process.send_signal(signal.SIGTERM)
            break
    try:
        process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
    if first_step is None:
        print("\n".join(tail), file=sys.stderr)
    summary = out / "summary.json"
    compiles = json.loads(summary.read_text()).get("compiles") if summary.exists() else None
    return {"first_env_step_s": first_step, "first_update_s": first_update, "compiles": compiles}


def measure(
    code: Path,
    preset: str,
    cache: str,
    label: str,
    entry: str,
    warm_runs: int = 1,
    extra: tuple = (),
) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="fastpop-startup-") as scratch:
        scratch = Path(scratch)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
        env["FASTPOP_CACHE_DIR"] = str(scratch / "fastpop-cache")
        warm = ["warm", *(f"warm{index}" for index in range(2, warm_runs + 1))][:warm_runs]
        runs = ["cold"] if cache == "none" else ["cold", *warm]
        if cache == "none":
            env["FASTPOP_COMPILE_CACHE"] = "0"
        if cache == "manual-cold-warm":
            env["JAX_COMPILATION_CACHE_DIR"] = str(scratch / "jax-cache")
        for index, run in enumerate(runs):
            result = measure_once(code, preset, env, scratch / f"run{index}", entry, extra)
            row = {"preset": preset, "label": label, "cache": cache, "run": run, **result}
            row = row | ({"set": list(extra)} if extra else {})
            row = row | ({"entry": entry} if entry != "module" else {})
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the fastpop checkout to run")
    parser.add_argument("--label", default="after")
    parser.add_argument("--cache", choices=("none", "cold-warm", "manual-cold-warm"))
    parser.add_argument("--presets", nargs="+", default=DEFAULT_PRESETS, choices=list(PRESETS))
    parser.add_argument("--entry", choices=("module", "console-script"), default="module")
    parser.add_argument("--output", type=Path, help="append the rows (JSON lines) to this file")
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for every preset measured, after the preset's own",
    )
    parser.add_argument(
        "--warm-runs",
        type=int,
        default=1,
        help="warm reruns after the cold run (warm, warm2, ...): a process-mode preset's second "
        "run may measure its members per chunk again (fastpop/population/chunking.py)",
    )
    args = parser.parse_args()
    for preset in args.presets:
        code = args.code.resolve()
        rows = measure(
            code, preset, args.cache, args.label, args.entry, args.warm_runs, tuple(args.set)
        )
        if args.output is not None:
            with args.output.open("a") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()

"""Start one `fastpop train|resume --distributed` run as COUNT processes on this machine, each
with DEVICES forced CPU devices, optionally stop one of them, and print what every process did.

    python results/scaling/local_processes.py --count 3 --devices 1 -- \
        train configs/td3_gymnax_pendulum_cpu.yaml --out runs/cemrl --set strategy=cemrl ...
    python results/scaling/local_processes.py --count 2 --signal kill --target 1 --after 25 -- \
        resume runs/dvd --set train.total_env_steps=100000

Prints one JSON line per process: exit code, seconds it ran, seconds from the signal to its exit,
its last log line; then the lock step's exchanges and seconds from summary.json (process 0).
Each process's log is kept beside the run as `<out>-process-<k>.log`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fastpop.distributed.flags import free_port

SIGNALS = {"kill": signal.SIGKILL, "int": signal.SIGINT}


def start(args: argparse.Namespace, logs: list[Path]) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"}
    flags = f"--xla_force_host_platform_device_count={args.devices}"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    port = free_port()
    processes = []
    for index, log in enumerate(logs):
        command = [sys.executable, "-m", "fastpop", *args.fastpop, "--distributed"]
        command += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(args.count)]
        command += ["--process-id", str(index)]
        with log.open("wb") as output:
            processes.append(
                subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
            )
    return processes


def run_directory(fastpop_args: list[str]) -> Path:
    if fastpop_args[0] == "resume":
        return Path(fastpop_args[1])
    return Path(fastpop_args[fastpop_args.index("--out") + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2, help="processes")
    parser.add_argument("--devices", type=int, default=2, help="forced CPU devices per process")
    parser.add_argument("--signal", choices=sorted(SIGNALS), help="send it to --target")
    parser.add_argument("--target", type=int, default=1, help="the process the signal goes to")
    parser.add_argument("--after", type=float, default=20.0, help="seconds before the signal")
    parser.add_argument("fastpop", nargs=argparse.REMAINDER, help="-- then fastpop's arguments")
    args = parser.parse_args()
    if args.fastpop[:1] == ["--"]:
        args.fastpop = args.fastpop[1:]
    out = run_directory(args.fastpop)
    logs = [out.with_name(f"{out.name}-process-{k}.log") for k in range(args.count)]
    started = time.monotonic()
    processes = start(args, logs)
    signalled = None
    if args.signal:
        time.sleep(args.after)
        processes[args.target].send_signal(SIGNALS[args.signal])
        signalled = time.monotonic()
    ended: dict[int, float] = {}
    while len(ended) < len(processes):  # each process's own exit time, whatever the order
        for index, process in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = time.monotonic()
        time.sleep(0.05)
    for index, process in enumerate(processes):
        lines = logs[index].read_text(errors="replace").strip().splitlines() or [""]
        report = {"process": index, "exit": process.returncode}
        report["seconds"] = round(ended[index] - started, 1)
        if signalled is not None and index != args.target:
            report["seconds_after_signal"] = round(ended[index] - signalled, 1)
        print(json.dumps({**report, "last_line": lines[-1][-200:]}))
    summary = out / "summary.json"
    if summary.exists():
        print(json.dumps({"lockstep": json.loads(summary.read_text()).get("lockstep")}))


if __name__ == "__main__":
    main()

"""`fastpop bench gpu`'s driver: each phase in a child process of its own, killed at its time
cap, the directory's manifest (`bench_gpu.json`) and README.md summary rewritten after each.

A child is started fresh for every phase so that no phase inherits another's device memory, a
crash or an out-of-memory error ends one phase only, and a cap can stop a phase stuck in a long
compile. This process never initialises an accelerator: what the device is comes from the
children's records (and nvidia-smi).
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import tarfile
import threading
import time
from pathlib import Path

from fastpop.bench.common import write_json
from fastpop.bench.gpu_learning import learning_phase
from fastpop.bench.gpu_learning_report import write_learning_readme
from fastpop.bench.gpu_phases import read_record, run_phase
from fastpop.bench.gpu_plans import MANIFEST, grace_seconds
from fastpop.bench.gpu_report import write_readme


class PhaseCapped(Exception):
    """SIGTERM in a phase's child: its cap passed (or the driver stopped)."""


def _raise_capped(signum, frame):
    raise PhaseCapped("the phase's time cap passed, or `fastpop bench gpu` was stopped")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_when_orphaned(parent: int) -> None:
    """SIGTERM to this child if the driver dies (killed, say, by a remote command's limit)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _child(phase: str, out_dir: str, plan: dict, cap: float, command: str, pack) -> None:
    os.setpgrp()  # the phase's own collector processes go with it when the cap kills it
    signal.signal(signal.SIGTERM, _raise_capped)
    watch = threading.Thread(target=_stop_when_orphaned, args=(os.getppid(),), daemon=True)
    watch.start()
    body = None
    if phase == "learning":  # each run packed as soon as it is written
        after_run = None if pack is None else functools.partial(pack_directory, Path(out_dir), pack)
        body = functools.partial(learning_phase, after_run=after_run)
    complete = run_phase(phase, Path(out_dir), plan, cap, command, body)
    raise SystemExit(0 if complete else 1)


def read_manifest(out_dir: Path) -> dict:
    try:
        return json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {"phases": {}}


def stop(process, grace: float) -> None:
    """SIGTERM to the child's process group, then SIGKILL after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        if not process.is_alive():
            return
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):  # not yet its own group
            process.kill() if sig == signal.SIGKILL else process.terminate()
        process.join(wait)


def run_phases(
    out_dir: Path,
    phases: list[str],
    plans: dict,
    caps: dict,
    command: str,
    programme: str,
    log=print,
    pack: Path | None = None,
) -> dict:
    """Every phase in turn; the manifest (what each phase did), also written to the directory.
    `programme`: which sizes the plans are (a key of gpu_plans.PROGRAMMES). `pack`: a tarball
    of the directory (less run checkpoints) written after every phase (and the learning phase's
    every run), so that a remote command cut at its limit still returns what finished."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out_dir)
    smoke = programme.endswith("smoke")
    manifest |= {"programme": programme, "smoke": smoke, "command": command}
    context = multiprocessing.get_context("spawn")
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # stop the child, then exit
    try:
        for phase in phases:
            run_one(
                out_dir, phase, (plans[phase], caps[phase], pack), command, manifest, context, log
            )
            if pack is not None:
                pack_directory(out_dir, pack)
                log(f"bench gpu: packed {out_dir} into {pack}")
    finally:
        signal.signal(signal.SIGTERM, previous)
    return manifest


def pack_directory(out_dir: Path, tarball: Path) -> None:
    """`out_dir` as a gzipped tarball, without `checkpoints/` (a pbt run's are GBs), written
    beside `tarball` and renamed over it: a reader never sees half a tarball."""
    partial = tarball.with_name(tarball.name + ".partial")
    skip = lambda info: None if "checkpoints" in Path(info.name).parts else info
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(out_dir, arcname=out_dir.as_posix(), filter=skip)
    partial.replace(tarball)


def phase_status(complete: bool, capped: bool, exit_code: int | None) -> str:
    """Done once the phase did all its work (`complete`: its record says so, nothing skipped
    for lack of time), even if its process was still exiting at the cap (a pipeline's 14
    collectors take seconds to stop): the files are all there. A capped phase's exit code
    says nothing (its SIGTERM can land where Python ignores the exception it raises, a GC
    callback, say)."""
    if complete and (capped or exit_code == 0):
        return "done"
    return "capped" if capped else "failed"


def run_one(out_dir, phase, planned, command, manifest, context, log) -> None:
    """One phase in a child process under its cap (`planned`: its plan, cap and the tarball
    its learning runs are packed into, or None); the manifest and README.md updated."""
    plan, cap, pack = planned
    log(f"bench gpu: phase {phase} (cap {cap:.0f} s)")
    entry = {"cap_seconds": cap, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    manifest["phases"][phase] = entry | {"status": "running"}
    write_json(manifest, out_dir / MANIFEST)
    (out_dir / f"phase_{phase}.json").unlink(missing_ok=True)  # an earlier run's, if any
    start = time.perf_counter()
    args = (phase, str(out_dir), plan, cap, command, pack)
    process = context.Process(target=_child, args=args, name=f"bench-gpu-{phase}")
    process.start()
    grace = grace_seconds(cap)  # a run's stop checkpoint
    try:
        process.join(cap)
    except BaseException:  # Ctrl-C or SIGTERM: the child, in its own group, is stopped too
        stop(process, grace)
        raise
    capped = process.is_alive()
    if capped:
        stop(process, grace)
    record = read_record(out_dir, phase) or {}
    whole = bool(record.get("complete")) and not record.get("cut_short")
    status = phase_status(whole, capped, process.exitcode)
    entry |= {"status": status, "seconds": time.perf_counter() - start}
    if capped and status == "done":
        entry["past_cap"] = True  # still exiting at its cap
    entry |= {"exit_code": process.exitcode, "files": record.get("files", [])}
    if status == "failed":
        entry["error"] = record.get("error", f"the phase's process exited {process.exitcode}")
    manifest["phases"][phase] = entry
    write_json(manifest, out_dir / MANIFEST)
    learning = manifest["programme"].startswith("learning")
    (write_learning_readme if learning else write_readme)(out_dir, manifest)
    past = " (its process was still exiting at the cap)" if entry.get("past_cap") else ""
    log(f"bench gpu: phase {phase} {status} in {entry['seconds']:.0f} s{past}")

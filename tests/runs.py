"""Running `fastpop train` as a subprocess in tests: presets, shortening overrides, and what a
run leaves behind (processes from /proc, shared memory from /dev/shm).

Runs that need exit codes or signals are `python -m fastpop train` subprocesses in their own
session, so a failing test can still remove everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def with_this_checkout(env: dict[str, str]) -> dict[str, str]:
    """`env` whose PYTHONPATH starts with this checkout: a child process started from any
    directory imports the fastpop under test, installed or not."""
    return env | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}


TD3_PENDULUM = REPO / "configs" / "td3_pendulum_cpu.yaml"
DQN_CARTPOLE = REPO / "configs" / "dqn_cartpole_cpu.yaml"
SIZE = 4  # population.size of both presets
TOLERANCE = 0.2  # replay.tolerance (the default)
# Tiny networks and one update per env step on batches of 32, learning after 256 steps; the
# default collect.chunk_len of 32 makes every insert 32 env steps per member.
FAST = [
    "agent.hidden_sizes=[16,16]",
    "agent.batch_size=32",
    "replay.samples_per_insert=32",
    "train.updates_per_call=10",
    "collect.warmup_steps=256",
    "replay.min_size=256",
    "eval.episodes=1",
    "log.progress_interval_seconds=0.2",
]
# A learner fed by hand (no collectors): tiny networks and replay, chunks of 8 rows.
SMALL = [
    "agent.hidden_sizes=[8,8]",
    "agent.batch_size=4",
    "replay.capacity=256",
    "replay.min_size=16",
    "collect.chunk_len=8",
    "train.updates_per_call=2",
    "replay.samples_per_insert=1",
]
# Long enough to still be training whenever a test interrupts it.
ENDLESS = ["train.total_env_steps=10_000_000", "eval.interval=1_000_000", "log.tensorboard=false"]
START_SECONDS = 120  # until a run is training (imports and compilation on a busy 2-core CPU)
STOP_SECONDS = 10  # a run must end this soon after a signal or a fatal worker death


# --- processes and shared memory, read from /proc and /dev/shm ---


def _stat(pid: int) -> tuple[int, str, int, int] | None:
    """(parent pid, state, start time in clock ticks, process group) of a process, None when
    it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19]), int(fields[2])


def _live_pids() -> dict[int, tuple[int, str, int, int]]:
    stats = {int(entry): _stat(int(entry)) for entry in os.listdir("/proc") if entry.isdigit()}
    return {pid: stat for pid, stat in stats.items() if stat is not None and stat[1] != "Z"}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for pid, (parent, _, start, _) in _live_pids().items():
        children.setdefault(parent, []).append((pid, start))
    found, stack = {}, [root]
    while stack:
        for pid, start in children.get(stack.pop(), []):
            found[pid] = start
            stack.append(pid)
    return found


def survivors(processes: dict[int, int], seconds: float = 5.0) -> list[str]:
    """Those of `processes` (pid -> start time) still alive after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [
            f"{pid}: {_cmdline(pid)}"
            for pid, start in processes.items()
            if (stat := _stat(pid)) is not None and stat[2] == start and stat[1] != "Z"
        ]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def segments(pid: int) -> set[str]:
    """Shared-memory segments created by process `pid` (fastpop names them fastpop_<pid>_*)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"fastpop_{pid}_")}


def worker_children(pid: int) -> list[int]:
    """The trainer's spawn-started workers, oldest first: collectors 0, 1, ..., the evaluator.

    Linux hands out pids in increasing order modulo `pid_max`, so the children's order is their
    distance above the trainer's pid, not their pid: a busy machine's pids wrap around, and a
    younger collector can get the smaller pid."""
    found = [
        child
        for child in descendants(pid)
        if _stat(child)[0] == pid and "multiprocessing.spawn" in _cmdline(child)
    ]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return sorted(found, key=lambda child: (child - pid) % pid_max)


# --- running `fastpop train` ---


class Trainer:
    """A `python -m fastpop train` (or, with `resume`, `fastpop resume`) subprocess with its
    output in files under `workdir`."""

    def __init__(
        self,
        workdir: Path,
        config: Path | None,
        overrides: list[str],
        out: str = "run",
        resume: bool = False,
        file_size_limit: int | None = None,
        environment: dict[str, str] | None = None,
    ):
        self.workdir, self.out = workdir, workdir / out
        logs = "resume-" if resume else ""
        self.stdout_path = workdir / f"{logs}stdout.txt"
        self.stderr_path = workdir / f"{logs}stderr.txt"
        env = with_this_checkout({**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"})
        env |= environment or {}

        def limit_files():  # in the child: files it writes stop growing here, as on a full disk
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

        command = [sys.executable, "-m", "fastpop"]
        command += ["resume", out] if resume else ["train", str(config), "--out", out]
        for override in overrides:
            command += ["--set", override]
        # A test run started in the background (`pytest &`) ignores SIGINT, and the trainer would
        # inherit that; a handler, unlike SIG_IGN, reverts to the default across exec.
        sigint = signal.getsignal(signal.SIGINT)
        if sigint == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with (
                self.stdout_path.open("wb") as stdout,
                self.stderr_path.open("wb") as stderr,
                warnings.catch_warnings(),
            ):
                # A preexec_fn makes Popen fork; the child only sets a limit and execs.
                warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
                self.process = subprocess.Popen(
                    command,
                    cwd=workdir,
                    env=env,
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,
                    preexec_fn=None if file_size_limit is None else limit_files,
                )
        finally:
            signal.signal(signal.SIGINT, sigint)
        self.pid = self.process.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait(self, seconds: float) -> int:
        try:
            return self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"fastpop train still running after {seconds} s\n{self.stdout[-3000:]}\n"
                f"{self.stderr[-3000:]}"
            )

    def wait_until_training(self) -> None:
        """Until the learner has updated (scalars.jsonl gets rows after the first update)."""
        scalars = self.out / "scalars.jsonl"
        deadline = time.monotonic() + START_SECONDS
        while not (scalars.exists() and scalars.read_text().strip()):
            if self.process.poll() is not None:
                pytest.fail(f"fastpop train exited with {self.process.returncode}:\n{self.stderr}")
            if time.monotonic() > deadline:
                pytest.fail(f"not training after {START_SECONDS} s:\n{self.stdout[-3000:]}")
            time.sleep(0.05)

    def workers(self, collectors: int) -> list[int]:
        """The collectors, then the evaluator (started with the first trained policies)."""
        deadline = time.monotonic() + START_SECONDS
        while len(workers := worker_children(self.pid)) < collectors + 1:
            assert time.monotonic() < deadline, f"expected {collectors} collectors and an evaluator"
            time.sleep(0.05)
        assert len(workers) == collectors + 1, f"expected {collectors} collectors and an evaluator"
        return workers

    def collectors(self, count: int) -> list[int]:
        return self.workers(count)[:count]

    def group(self) -> list[int]:
        """Live processes of the run's session (it outlives the trainer while any lives)."""
        return [pid for pid, stat in _live_pids().items() if stat[3] == self.pid]

    def cleanup(self) -> None:
        """Whatever a failed test left behind. The resource tracker is spared at first: once
        the others are gone it exits by itself and removes their segments and semaphores."""
        for pid in self.group():
            if "resource_tracker" not in _cmdline(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 5
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        for name in segments(self.pid):
            (Path("/dev/shm") / name).unlink(missing_ok=True)


@pytest.fixture
def trainers(tmp_path):
    started: list[Trainer] = []

    def start(config: Path | None, *overrides: str, out: str = "run", **options) -> Trainer:
        trainer = Trainer(tmp_path, config, list(overrides), out, **options)
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.cleanup()


def assert_clean_stderr(stderr: str) -> None:
    """No traceback, and nothing the resource tracker had to clean up after the trainer."""
    assert "Traceback" not in stderr, stderr
    assert "leaked" not in stderr, stderr


def completed_run(start, config: Path, *overrides: str) -> Path:
    """Start `fastpop train` with the `trainers` fixture's `start`, wait for a clean exit 0 and
    return the run directory."""
    trainer = start(config, *overrides)
    assert trainer.wait(START_SECONDS) == 0, trainer.stderr
    assert_clean_stderr(trainer.stderr)
    return trainer.out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

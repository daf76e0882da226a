"""`fastpop train/resume --distributed`: two processes on localhost (jax.distributed with gloo
CPU collectives), each with 2 forced CPU devices, training one TD3 PBT population of 4."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fastpop.distributed.flags import free_port
from tests.runs import FAST, REPO, TD3_PENDULUM, read_jsonl, segments, with_this_checkout

pytestmark = pytest.mark.xdist_group("distributed")

RUN_SECONDS = 150  # a whole two-process run on a loaded 2-core CPU
LOST_SECONDS = 30  # the survivor of a killed process must be gone this soon
HEARTBEAT_SECONDS = 4  # `--heartbeat-seconds` of these runs: a loss is noticed this soon
LATE_SECONDS = HEARTBEAT_SECONDS + 2  # process 1 of the trained run ends this much later
TRAINED_STEPS = 960  # per member
OVERRIDES = [
    *FAST,
    "population.devices=all",
    "strategy=pbt",
    "population.priors={actor_lr: {log_uniform: [1.0e-4, 3.0e-3]}}",
    "pbt.interval=200",
    "eval.interval=200",
    # Rounds on the evaluations at 224, 416, 608 and 800 steps per member, whatever the load:
    # the learner waits for each one (asynchronous PBT's last rounds may come after training
    # ended when a busy CPU slows the evaluator), and the rate limiter lets collection run at
    # most ~100 steps past an evaluation, so none is still pending at the last env step.
    "pbt.wait=true",
    f"train.total_env_steps={TRAINED_STEPS}",
    "replay.samples_per_insert=8",
    "collect.num_collectors=1",
    "log.tensorboard=false",
]


DISTRIBUTED_CACHE = Path(tempfile.gettempdir()) / f"fastpop-test-distributed-cache-{os.getuid()}"


class Processes:
    """`python -m fastpop ARGS --distributed` as processes 0 .. count-1 of one run."""

    def __init__(
        self,
        workdir: Path,
        args: list[str],
        count: int = 2,
        tag: str = "run",
        late: float = 0,
        devices: int = 2,
    ):
        """`late`: process 1 ends that many seconds after its run (tests/late_finish.py);
        `devices`: forced CPU devices per process."""
        port, self.workdir = free_port(), workdir
        env = with_this_checkout({**os.environ, "PYTHONUNBUFFERED": "1", "JAX_PLATFORMS": "cpu"})
        flags = os.environ.get("XLA_FLAGS", "")  # tests/conftest.py's compile settings
        env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        # fastpop's own compilation cache, as a user's runs have it (size-limited: every process
        # writes what it compiled, fastpop/compilation/every_process_writes.py), one for every
        # distributed test: the resumes, and the next session, load what the first run compiled.
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        env["FASTPOP_CACHE_DIR"] = str(DISTRIBUTED_CACHE)
        env["LATE_FINISH_SECONDS"] = str(late)
        module = "tests.late_finish" if late else "fastpop"
        self.logs, self.processes = [], []
        for index in range(count):
            log = workdir / f"{tag}-{index}.txt"
            command = [sys.executable, "-m", module, *args, "--distributed"]
            command += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", str(count)]
            command += ["--process-id", str(index), "--heartbeat-seconds", str(HEARTBEAT_SECONDS)]
            with log.open("wb") as output:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=workdir,
                        env=env,
                        stdout=output,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            self.logs.append(log)

    def output(self, index: int) -> str:
        return self.logs[index].read_text()

    def wait(self, seconds: float) -> list[int]:
        deadline = time.monotonic() + seconds
        try:
            return [p.wait(max(0.1, deadline - time.monotonic())) for p in self.processes]
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {seconds} s:\n{self.output(0)[-3000:]}")

    def cleanup(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for name in segments(process.pid):
                (Path("/dev/shm") / name).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("distributed")


@pytest.fixture(scope="module")
def trained(workdir):
    """A completed two-process run (its directory), shared by the tests below. Process 1 ends
    a heartbeat timeout and more after the coordinator is done: both still exit 0."""
    args = ["train", str(TD3_PENDULUM), "--out", "run"]
    for override in OVERRIDES:
        args += ["--set", override]
    run = Processes(workdir, args, late=LATE_SECONDS)
    try:
        codes = run.wait(RUN_SECONDS)
    finally:
        run.cleanup()
    assert codes == [0, 0], run.output(0)[-3000:] + run.output(1)[-3000:]
    return workdir / "run"


def assert_rows_once(run_dir: Path, size: int = 4) -> list[dict]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    keys = [(row["eval_index"], row["member"]) for row in rows]
    assert len(keys) == len(set(keys)), "an (evaluation, member) row was written twice"
    rounds = sorted({index for index, _ in keys})
    assert rounds == list(range(len(rounds)))
    assert sorted(keys) == [(i, m) for i in rounds for m in range(size)]
    return rows


def test_two_processes_train_one_population(trained):
    rows = assert_rows_once(trained)
    assert max(row["member_env_steps"] for row in rows) >= TRAINED_STEPS
    lineage = read_jsonl(trained / "lineage.jsonl")
    assert [(row["kind"], row["round"]) for row in lineage] == [("exploit", n) for n in range(4)]
    own = trained / "processes" / "1" / "metrics.jsonl"  # process 1's own files: no rows
    assert not own.exists() or not read_jsonl(own)
    (checkpoint,) = sorted((trained / "checkpoints").iterdir())
    manifest = json.loads((checkpoint / "manifest" / "metadata").read_text())
    assert manifest["topology"] == {"processes": 2, "devices": 4}
    assert len(manifest["digests"]) == 2
    assert json.loads((trained / "summary.json").read_text())["stopped_by"] == "completed"


def test_resume_on_another_topology_exits_2(trained, workdir):
    one = Processes(workdir, ["resume", "run"], count=1, tag="one")
    try:
        assert one.wait(RUN_SECONDS) == [2]
    finally:
        one.cleanup()
    assert "written by 2 processes with 4 devices" in one.output(0)
    assert "1 processes with 2 devices" in one.output(0)


def wait_for_a_round_after_resume(
    run: Processes, metrics: Path, before: int, size: int = 4
) -> None:
    deadline = time.monotonic() + RUN_SECONDS
    while len(read_jsonl(metrics)) < before + size:
        assert run.processes[0].poll() is None, run.output(0)[-3000:]
        assert time.monotonic() < deadline, run.output(0)[-3000:]
        time.sleep(0.2)


def test_ctrl_c_on_process_0_stops_every_process_with_a_checkpoint(trained, workdir):
    before = len(read_jsonl(trained / "metrics.jsonl"))
    steps = sorted((trained / "checkpoints").iterdir())
    run = Processes(workdir, ["resume", "run", "--set", "train.total_env_steps=100000"], tag="int")
    try:
        wait_for_a_round_after_resume(run, trained / "metrics.jsonl", before)
        os.killpg(run.processes[0].pid, signal.SIGINT)  # Ctrl-C in process 0's terminal
        codes = run.wait(LOST_SECONDS)
    finally:
        run.cleanup()
    assert codes == [130, 130], run.output(0)[-3000:] + run.output(1)[-3000:]
    assert json.loads((trained / "summary.json").read_text())["stopped_by"] == "interrupted"
    own = json.loads((trained / "processes" / "1" / "summary.json").read_text())  # process 1's
    assert own["stopped_by"] == "interrupted" and own["compiles"]["programs"] > 0
    assert own["compiles"]["cache"] == f"{DISTRIBUTED_CACHE / 'jax-compile'} (fastpop's)"
    # It loaded what process 1 of the first run compiled: on a CPU a program's cache key names
    # its devices, and JAX alone writes process 0's programs only (every_process_writes.py).
    assert own["compiles"]["from_cache"] > 0, own["compiles"]
    newest = sorted((trained / "checkpoints").iterdir())[-1]  # written at the stop
    assert newest not in steps
    assert json.loads((newest / "manifest" / "metadata").read_text())["topology"]["processes"] == 2
    assert_rows_once(trained)


def test_resume_continues_and_a_killed_process_stops_the_other(trained, workdir):
    before = len(read_jsonl(trained / "metrics.jsonl"))
    run = Processes(workdir, ["resume", "run", "--set", "train.total_env_steps=100000"])
    try:
        wait_for_a_round_after_resume(run, trained / "metrics.jsonl", before)
        os.kill(run.processes[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        code = run.processes[0].wait(LOST_SECONDS + 10)
        stopped_in = time.monotonic() - killed
    finally:
        run.cleanup()
    output = run.output(0)
    assert "resumed from" in output
    assert code == 1 and stopped_in < LOST_SECONDS, (stopped_in, output[-3000:])
    assert "process 1 of the distributed run is gone" in output
    assert_rows_once(trained)  # the resumed rounds continue the numbering, none twice
    events = [event["kind"] for event in read_jsonl(trained / "events.jsonl")]
    assert events[-1] == "process_lost" and "resumed" in events


def test_distributed_without_a_coordinator_exits_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "JAX_C"))}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-m", "fastpop", "train", str(TD3_PENDULUM), "--distributed"]
    result = subprocess.run(
        [*command, "--out", "run"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "--coordinator HOST:PORT --num-processes N --process-id I" in result.stderr
    assert "srun" in result.stderr
    assert not (tmp_path / "run").exists()


def test_distributed_flags_that_cannot_start_a_run_are_named():
    from fastpop.commands.cli import build_parser
    from fastpop.config import ConfigError
    from fastpop.distributed.flags import resolve

    def arguments(*flags: str) -> dict | None:
        return resolve(build_parser().parse_args(["train", "run.yaml", *flags]))

    one = ["--distributed", "--coordinator", "h:1234", "--num-processes", "2", "--process-id", "1"]
    assert arguments(*one)["heartbeat_timeout_seconds"] == 10
    assert arguments(*one, "--heartbeat-seconds", "30")["heartbeat_timeout_seconds"] == 30
    refused = {
        "--heartbeat-seconds 1: expected 2 or more": [*one, "--heartbeat-seconds", "1"],
        "--heartbeat-seconds belongs to --distributed": ["--heartbeat-seconds", "30"],
        "--coordinator h:x: expected HOST:PORT": [*one[:2], "h:x", *one[3:]],
        "the process ids are 0 .. N-1": [*one[:-1], "2"],
        "--coordinator needs --process-id too": one[:-2],
    }
    for message, flags in refused.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            arguments(*flags)


def test_every_strategy_and_replay_layout_runs_distributed_but_one_device_is_refused():
    from fastpop.config import ConfigError, load_config
    from fastpop.distributed.flags import check_parts
    from fastpop.run.parts import build_run

    parts = lambda *overrides: build_run(load_config(TD3_PENDULUM, [*FAST, *overrides]))
    for strategy in ("cemrl", "dvd"):  # a shared critic and replay over every process
        shared = [f"strategy={strategy}", "population.size=3", "replay.shared=true"]
        check_parts(parts(*shared, "population.devices=all"))
    with pytest.raises(ConfigError, match=r"set population\.devices: all"):
        check_parts(parts("population.devices=1"))


class FakeCoordination:
    """The coordination service's calls `wait_for_survivors` makes: who is live, which keys."""

    def __init__(self, live: set[int]):
        self.live, self.keys, self.asked = live, {}, 0

    def get_live_nodes(self, processes):
        self.asked += 1
        return [p for p in processes if p in self.live]

    def key_value_try_get(self, key):
        if key not in self.keys:
            raise KeyError(key)
        return self.keys[key]


def test_the_coordinator_leaves_after_every_live_survivor_has_stopped():
    """Process 0 shutting its service down under a survivor gets that one aborted by JAX's
    client without a message: so it waits for the survivors' word, only theirs, and bounded."""
    from fastpop.distributed.lockstep import DONE_PREFIX, STOPPED_PREFIX, wait_for_survivors

    service = FakeCoordination(live={0, 2, 3})  # process 1 was lost
    assert wait_for_survivors(service, 4, seconds=0.5) == [2, 3]
    service.keys[f"{STOPPED_PREFIX}/2"] = "1"
    assert wait_for_survivors(service, 4, seconds=0.5) == [3]
    service.keys[f"{DONE_PREFIX}/3"] = "1"  # it had ended normally
    service.asked = 0
    assert wait_for_survivors(service, 4, seconds=30) == []
    assert service.asked == 1  # one question (the lost process is not live), no waiting
    assert wait_for_survivors(FakeCoordination(live={0}), 4, seconds=30) == []

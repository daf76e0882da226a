"""`--cpu-seconds`: the tests' figures and the programs' XLA seconds, summed over the reports
that carry them (as pytest-xdist's workers send them), ranked in the session's summary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from types import SimpleNamespace

from tests import child_stages, cpu_seconds


class Lines:
    def __init__(self):
        self.lines = []

    def write_sep(self, _sep, title):
        self.lines.append(f"== {title}")

    def write_line(self, line):
        self.lines.append(line)


def report(nodeid, spent, programs, loaded=0, compiled=()):
    properties = [
        (cpu_seconds.FIELD, spent),
        (cpu_seconds.PROGRAMS_FIELD, programs),
        (cpu_seconds.CACHE_FIELD, {"loaded": loaded, "compiled": list(compiled)}),
    ]
    return SimpleNamespace(nodeid=nodeid, user_properties=properties)


def write_children(directory, records):
    for pid, record in enumerate(records):
        (directory / f"{pid}.json").write_text(json.dumps(record))


def test_the_summary_sums_each_tests_phases_and_each_programs_compiles(monkeypatch, tmp_path):
    """...and its child processes' compile stages, which they wrote as they exited."""
    monkeypatch.setattr(cpu_seconds, "_totals", defaultdict(lambda: [0.0] * 4))
    monkeypatch.setattr(cpu_seconds, "_programs", defaultdict(lambda: [0, 0.0]))
    monkeypatch.setattr(cpu_seconds, "_program_files", defaultdict(set))
    monkeypatch.setattr(cpu_seconds, "_cache", {"loaded": 0, "compiled": defaultdict(int)})
    monkeypatch.setattr(cpu_seconds, "_session_ticks", [])  # no idle line, whatever the session
    monkeypatch.setenv(child_stages.DIRECTORY, str(tmp_path))
    a, b, c = "tests/test_a.py::a", "tests/test_b.py::b@group", "tests/test_b.py::c"
    stages = {"trace": 0.0, "lower": 0.0, "xla": 0.0}
    write_children(
        tmp_path,
        [  # b's process (named without pytest-xdist's group), c's, and a deselected test's
            {"test": "tests/test_b.py::b", "cpu": 0.4, "jax": True, **stages, "trace": 0.3},
            {"test": "tests/test_b.py::b", "cpu": 0.1, "jax": True, **stages, "xla": 1.0},
            {"test": c, "cpu": 0.2, "jax": False, **stages},
            {"test": "tests/test_b.py::d", "cpu": 0.3, "jax": True, **stages, "lower": 0.5},
        ],
    )
    for phase in [  # a's setup, then call (two workers compiled key "u" at once), then b, c
        report(a, [1.0, 0.5, 0.25, 0.25], {"jit(update)": [2, 1.5]}, 0, ["u", "v"]),
        report(a, [2.0, 0.0, 0.0, 1.0], {"jit(update)": [1, 0.5], "jit(init)": [1, 0.2]}, 1),
        report(b, [0.5, 0.0, 0.0, 0.0], {"jit(init)": [3, 0.3]}, 2, ["u", "w"]),
        report(c, [2.8, 1.0, 0.5, 0.0], {}),
    ]:
        cpu_seconds.collect(phase)
    terminal = Lines()
    cpu_seconds.summary(terminal, 5)
    table = terminal.lines
    assert table[2].split() == ["3.0", "0.5", "0.2", "1.2", a]
    assert table[3].split() == ["2.8", "1.0", "0.5", "0.0", c]
    assert table[4].split() == ["0.5", "0.3", "0.0", "1.0", b]  # its processes' stages added
    assert table[5].split()[:4] == ["6.3", "1.8", "0.8", "2.2"]
    # Each file's tests summed: test_b.py's two pass test_a.py's one.
    assert table[6] == "== 2 test files with the most CPU seconds"
    assert [line.split() for line in table[7:9]] == [
        ["3.3", "1.3", "0.5", "1.0", "tests/test_b.py"],
        ["3.0", "0.5", "0.2", "1.2", "tests/test_a.py"],
    ]
    assert [line.split() for line in table[-4:-2]] == [
        ["3", "2.0", "1", "jit(update)"],  # compiles, XLA seconds, test files compiling it
        ["4", "0.5", "2", "jit(init)"],
    ]
    assert table[-2] == (
        "compilation cache: 4 programs compiled, 3 loaded; 1 compiled again under a key "
        "already compiled (in two processes at once)"
    )
    assert table[-1] == (
        "the processes the tests started: 4 that exited on their own (3 imported JAX), "
        "1.0 CPU-s, of which tracing 0.3, lowering 0.5 and XLA 1.0"
    )


def test_the_cache_lookups_jax_logs_are_counted_and_still_logged(monkeypatch):
    """The counting wraps the two functions JAX logs its persistent cache's lookups with (a
    JAX without them would count nothing: this one has them), and they still log."""
    from jax._src import compiler

    logged = []
    for name in ("log_persistent_cache_hit", "log_persistent_cache_miss"):
        assert callable(getattr(compiler, name))
        monkeypatch.setattr(compiler, name, lambda module, key, name=name: logged.append(name))
    monkeypatch.setattr(cpu_seconds, "_cache_pending", {"loaded": 0, "compiled": []})
    cpu_seconds._count_lookups()
    compiler.log_persistent_cache_miss("jit_update", "jit_update-k1")
    compiler.log_persistent_cache_hit("jit_update", "jit_update-k1")
    compiler.log_persistent_cache_hit("jit_init", "jit_init-k2")
    assert cpu_seconds._cache_pending == {"loaded": 2, "compiled": ["jit_update-k1"]}
    assert logged == ["log_persistent_cache_miss", *["log_persistent_cache_hit"] * 2]


def test_no_summary_unless_asked():
    terminal = Lines()
    cpu_seconds.summary(terminal, 0)
    assert terminal.lines == []


def test_the_cores_idle_share_is_read_from_proc_stat(monkeypatch, tmp_path):
    """/proc/stat's first line: user nice system idle iowait ...; idle and iowait are idle."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(cpu_seconds, "_PROC_STAT", str(stat))
    stat.write_text("cpu  100 0 50 40 10 0 0 0 0 0\ncpu0 1 2 3 4 5\n")
    start = cpu_seconds.cpu_ticks()
    assert start == (200, 50)
    stat.write_text("cpu  250 0 80 100 20 0 0 0 0 0\n")
    assert cpu_seconds.idle_share(start, cpu_seconds.cpu_ticks()) == (120 - 50) / (450 - 200)
    monkeypatch.setattr(cpu_seconds, "_PROC_STAT", str(tmp_path / "none"))
    assert cpu_seconds.cpu_ticks() is None


def child(tmp_path, code: str, test: str | None, path: list) -> subprocess.CompletedProcess:
    env = {**os.environ, child_stages.DIRECTORY: str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    env.pop("PYTEST_CURRENT_TEST", None)
    if test is not None:
        env["PYTEST_CURRENT_TEST"] = test
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=tmp_path)


def test_a_tests_process_writes_its_compile_stages_as_it_exits(tmp_path, monkeypatch):
    """A process the session's PYTHONPATH reaches writes its CPU seconds and the seconds JAX
    spent tracing, lowering and compiling its program, named by the test that started it."""
    started = child(
        tmp_path,
        "import jax; jax.jit(lambda x: x * 2 + 1)(1.0).block_until_ready()",
        "tests/test_a.py::b[c] (call)",
        [child_stages.SITE],
    )
    monkeypatch.setenv(child_stages.DIRECTORY, str(tmp_path))
    [record] = child_stages.records()
    assert started.returncode == 0 and record["test"] == "tests/test_a.py::b[c]"
    assert record["jax"] is True and record["cpu"] > 0
    assert all(record[stage] > 0 for stage in child_stages.STAGES), record


def test_a_process_no_test_started_writes_nothing_and_another_sitecustomize_still_runs(tmp_path):
    """pytest-xdist's workers inherit the path too: at their exit no test is running. And a
    `sitecustomize` of the user's, further along the path, is not shadowed."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("open('ran', 'w').close()\n")
    child(tmp_path, "import sys", None, [child_stages.SITE, theirs])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ran", "theirs"]


def test_the_started_processes_listen_for_the_stages_the_tests_processes_do(monkeypatch):
    """The child's `sitecustomize` imports nothing of the tests (its process may not find them),
    so it names JAX's events itself: the same events, the same columns."""
    monkeypatch.delenv(child_stages.DIRECTORY, raising=False)  # loaded here, it sets up nothing
    spec = importlib.util.spec_from_file_location(
        "child_sitecustomize", child_stages.SITE / "sitecustomize.py"
    )
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    assert site.STAGES == cpu_seconds.STAGES
    assert tuple(site.STAGES.values()) == child_stages.STAGES == cpu_seconds.COLUMNS[1:]
    assert site.DIRECTORY == child_stages.DIRECTORY

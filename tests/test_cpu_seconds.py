"""`--cpu-seconds`: the tests' figures and the programs' XLA seconds, summed over the reports
that carry them (as pytest-xdist's workers send them), ranked in the session's summary."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

from tests import cpu_seconds


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


def test_the_summary_sums_each_tests_phases_and_each_programs_compiles(monkeypatch):
    monkeypatch.setattr(cpu_seconds, "_totals", defaultdict(lambda: [0.0] * 4))
    monkeypatch.setattr(cpu_seconds, "_programs", defaultdict(lambda: [0, 0.0]))
    monkeypatch.setattr(cpu_seconds, "_program_files", defaultdict(set))
    monkeypatch.setattr(cpu_seconds, "_cache", {"loaded": 0, "compiled": defaultdict(int)})
    a, b, c = "tests/test_a.py::a", "tests/test_b.py::b", "tests/test_b.py::c"
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
    assert table[4].split() == ["0.5", "0.0", "0.0", "0.0", b]
    assert table[5].split()[:4] == ["6.3", "1.5", "0.8", "1.2"]
    # Each file's tests summed: test_b.py's two pass test_a.py's one.
    assert table[6] == "== 2 test files with the most CPU seconds"
    assert [line.split() for line in table[7:9]] == [
        ["3.3", "1.0", "0.5", "0.0", "tests/test_b.py"],
        ["3.0", "0.5", "0.2", "1.2", "tests/test_a.py"],
    ]
    assert [line.split() for line in table[-3:-1]] == [
        ["3", "2.0", "1", "jit(update)"],  # compiles, XLA seconds, test files compiling it
        ["4", "0.5", "2", "jit(init)"],
    ]
    assert table[-1] == (
        "compilation cache: 4 programs compiled, 3 loaded; 1 compiled again under a key "
        "already compiled (in two processes at once)"
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

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


def report(nodeid, spent, programs):
    properties = [(cpu_seconds.FIELD, spent), (cpu_seconds.PROGRAMS_FIELD, programs)]
    return SimpleNamespace(nodeid=nodeid, user_properties=properties)


def test_the_summary_sums_each_tests_phases_and_each_programs_compiles(monkeypatch):
    monkeypatch.setattr(cpu_seconds, "_totals", defaultdict(lambda: [0.0] * 4))
    monkeypatch.setattr(cpu_seconds, "_programs", defaultdict(lambda: [0, 0.0]))
    for phase in [
        report("a", [1.0, 0.5, 0.25, 0.25], {"jit(update)": [2, 1.5]}),  # a's setup, then call
        report("a", [2.0, 0.0, 0.0, 1.0], {"jit(update)": [1, 0.5], "jit(init)": [1, 0.2]}),
        report("b", [0.5, 0.0, 0.0, 0.0], {"jit(init)": [3, 0.3]}),
    ]:
        cpu_seconds.collect(phase)
    terminal = Lines()
    cpu_seconds.summary(terminal, 5)
    table = terminal.lines
    assert table[2].split() == ["3.0", "0.5", "0.2", "1.2", "a"]
    assert table[3].split() == ["0.5", "0.0", "0.0", "0.0", "b"]
    assert table[4].split()[:4] == ["3.5", "0.5", "0.2", "1.2"]
    assert [line.split() for line in table[-2:]] == [
        ["3", "2.0", "jit(update)"],
        ["4", "0.5", "jit(init)"],
    ]


def test_no_summary_unless_asked():
    terminal = Lines()
    cpu_seconds.summary(terminal, 0)
    assert terminal.lines == []

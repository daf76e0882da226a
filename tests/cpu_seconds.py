"""`--cpu-seconds N`: the N tests that took the most CPU seconds (this process's threads, XLA's
compiles included, and every child process it waited for: `fastpop train`, collectors, the
distributed tests' processes), summed over setup, call and teardown, printed at the end of the
session. Wall time (`--durations`) hides where a cold suite spends its 2 cores: a test waiting
on a subprocess and a test compiling look alike there. Works with pytest-xdist (each worker
sends its tests' figures with their reports) and with `-n 0`.

Beside each, the seconds the test's processes spent in JAX's three compile stages, from JAX's
monitoring events: tracing to a jaxpr, lowering it to an MLIR module, and XLA compiling it (or
loading it from the compilation cache, which takes milliseconds). Its own process's, plus those
of the processes it started that exited on their own (tests/child_stages.py), with a line on
those processes in all. From an empty cache, XLA's column is what a warm rerun saves; tracing
and lowering are paid on every run.

Then the same figures summed per test file: where a file's tests share a fixture's run or
one program family, its total shows what no single test does.

Then the programs whose XLA compiles took the most of those seconds, over all the tests, by the
name JAX gives them (`jit(update)`): how many times a program of that name was compiled (or
loaded from the cache) and the seconds in all. Many compiles of one name are one program at
many tests' shapes: the lever is fewer distinct shapes, or a program that compiles faster.
Beside each, how many test files compiled it: a program compiled by many files at as many
shapes is where shapes shared across the files would save compiles.
Last, the compilation cache's side: how many programs the tests' processes compiled and how
many they loaded, and how many were compiled twice under one cache key (two processes
compiling one program at once, before either had written it: work sharing could save only
those). And how much of the session's wall time the machine's cores stood idle (Linux's
/proc/stat, every process on the machine counted): near zero, the suite is bound by CPU
seconds, and no scheduling of its tests can shorten it."""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

from tests import child_stages

FIELD = "cpu_seconds"
PROGRAMS_FIELD = "xla_programs"
CACHE_FIELD = "compile_cache"
XLA_EVENT = "/jax/core/compile/backend_compile_duration"
# JAX's monitoring events of a program's compile stages (jax/_src/dispatch.py), by column.
STAGES = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "xla",
}
COLUMNS = ("cpu", *STAGES.values())
_stage_seconds = dict.fromkeys(STAGES.values(), 0.0)  # this process's, since it started
_listening = False
_PHASE_START = pytest.StashKey[tuple]()  # a phase's `now()` as it began
_totals: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * len(COLUMNS))
# XLA's compiles by program name: this process's since its last report ([count, seconds]),
# and, on the reporting process, the session's.
_programs_pending: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_programs: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_program_files: defaultdict[str, set[str]] = defaultdict(set)  # the test files compiling each
# The persistent cache's lookups: this process's since its last report, and, on the reporting
# process, the session's: programs loaded, and the keys of those compiled (each a miss).
_cache_pending = {"loaded": 0, "compiled": []}
_cache = {"loaded": 0, "compiled": defaultdict(int)}


_PROC_STAT = "/proc/stat"
_session_ticks: list[int] = []  # (all, idle) jiffies of the machine's cores at session start


def cpu_ticks() -> tuple[int, int] | None:
    """(all, idle) jiffies of every core since boot, from /proc/stat's first line (idle and
    iowait counted idle); None where there is no such file."""
    try:
        with open(_PROC_STAT) as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + fields[4]


def start_session(config: pytest.Config) -> None:
    """On the process that reports, as the session starts (with --cpu-seconds)."""
    if not config.getoption("--cpu-seconds"):
        return
    child_stages.start(config)
    if (ticks := cpu_ticks()) is not None:
        _session_ticks[:] = ticks


def idle_share(start: tuple[int, int], end: tuple[int, int]) -> float:
    """The share of the cores' time between two `cpu_ticks` that was idle."""
    elapsed = end[0] - start[0]
    return (end[1] - start[1]) / elapsed if elapsed > 0 else 0.0


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-seconds",
        type=int,
        default=0,
        metavar="N",
        help="show the N tests that took the most CPU seconds (children included)",
    )


def cpu_now() -> float:
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _on_duration(event: str, duration_secs: float, **metadata) -> None:
    stage = STAGES.get(event)
    if stage is not None:
        _stage_seconds[stage] += duration_secs
    if event == XLA_EVENT:
        program = _programs_pending[str(metadata.get("fun_name"))]
        program[0] += 1
        program[1] += duration_secs


def _count_lookups() -> None:
    """Counts the persistent cache's hits and misses, through the two functions JAX logs them
    with (jax._src.compiler, private: where a JAX lacks them, nothing is counted)."""
    from jax._src import compiler

    def counting(original, hit: bool):
        def logged(module_name, cache_key):
            if hit:
                _cache_pending["loaded"] += 1
            else:
                _cache_pending["compiled"].append(str(cache_key))
            return original(module_name, cache_key)

        return logged

    for name, hit in (("log_persistent_cache_hit", True), ("log_persistent_cache_miss", False)):
        if callable(original := getattr(compiler, name, None)):
            setattr(compiler, name, counting(original, hit))


def now() -> tuple[float, ...]:
    """This process's counters, in COLUMNS' order: CPU seconds (children included), then the
    seconds in each compile stage (counted from the first call on)."""
    global _listening
    if not _listening:
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        _count_lookups()
        _listening = True
    return (cpu_now(), *_stage_seconds.values())


def start_phase(item: pytest.Item) -> None:
    """Before a test's setup, call or teardown (with --cpu-seconds): the counters it starts from."""
    if item.config.getoption("--cpu-seconds"):
        item.stash[_PHASE_START] = now()


def end_phase(item: pytest.Item, report: pytest.TestReport) -> None:
    """On the process that ran the phase: what it spent since `start_phase` travels with its
    report."""
    if item.config.getoption("--cpu-seconds") and _PHASE_START in item.stash:
        spent = [end - begun for end, begun in zip(now(), item.stash[_PHASE_START], strict=True)]
        report.user_properties.append((FIELD, spent))
        report.user_properties.append((PROGRAMS_FIELD, dict(_programs_pending)))
        report.user_properties.append((CACHE_FIELD, dict(_cache_pending)))
        _programs_pending.clear()
        _cache_pending.update(loaded=0, compiled=[])


def collect(report: pytest.TestReport) -> None:
    """On the process that reports (xdist's controller, or the only one)."""
    for name, values in report.user_properties:
        if name == FIELD:
            _add_columns(_totals[report.nodeid], values)
        elif name == PROGRAMS_FIELD:
            for program, (count, seconds) in values.items():
                _programs[program][0] += count
                _programs[program][1] += seconds
                _program_files[program].add(file_of(report.nodeid))
        elif name == CACHE_FIELD:
            _cache["loaded"] += values["loaded"]
            for key in values["compiled"]:
                _cache["compiled"][key] += 1


def summary(terminal, count: int) -> None:
    if not count or not _totals:
        return
    children = child_stages.records()
    add_children_stages(_totals, children)
    terminal.write_sep("=", f"{count} tests with the most CPU seconds (children included)")
    terminal.write_line("     cpu   trace   lower     xla  (seconds; the stages: its processes')")
    for nodeid, values in sorted(_totals.items(), key=lambda item: -item[1][0])[:count]:
        terminal.write_line(f"{_row(values)}  {nodeid}")
    sums = [sum(values[column] for values in _totals.values()) for column in range(len(COLUMNS))]
    terminal.write_line(f"{_row(sums)}  in all, {len(_totals)} tests")
    files = by_file(_totals)
    terminal.write_sep("=", f"{min(count, len(files))} test files with the most CPU seconds")
    for path, values in sorted(files.items(), key=lambda item: -item[1][0])[:count]:
        terminal.write_line(f"{_row(values)}  {path}")
    terminal.write_sep("=", f"{count} programs with the most XLA seconds (the tests' processes)")
    terminal.write_line("  compiles     xla   files  program")
    ranked = sorted(_programs.items(), key=lambda item: -item[1][1])[:count]
    for program, (compiles, seconds) in ranked:
        files = len(_program_files[program])
        terminal.write_line(f"{compiles:10d} {seconds:7.1f} {files:7d}  {program}")
    compiled = _cache["compiled"]
    terminal.write_line(
        f"compilation cache: {sum(compiled.values())} programs compiled, {_cache['loaded']} "
        f"loaded; {sum(n - 1 for n in compiled.values() if n > 1)} compiled again under a key "
        "already compiled (in two processes at once)"
    )
    terminal.write_line(child_stages.totals_line(children))
    if _session_ticks and (ticks := cpu_ticks()) is not None:
        share = idle_share(tuple(_session_ticks), ticks)
        terminal.write_line(f"the machine's cores stood idle {share:.1%} of the session")


def add_children_stages(totals: dict[str, list[float]], children: list[dict]) -> None:
    """Each test's child processes' stages (`child_stages.records()`) added to its own, in place.
    A child names its test by the node id pytest gives it in that process; the reports' node ids
    may end in "@group" (pytest-xdist's `--dist loadgroup`)."""
    by_plain_id = {}
    for nodeid in totals:
        by_plain_id.setdefault(nodeid, nodeid)
        by_plain_id.setdefault(nodeid.rsplit("@", 1)[0], nodeid)
    for child in children:
        if (nodeid := by_plain_id.get(child["test"])) is not None:
            _add_columns(totals[nodeid], [0.0, *(child[stage] for stage in child_stages.STAGES)])


def by_file(totals: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each test file's tests' figures summed, column by column."""
    files: defaultdict[str, list[float]] = defaultdict(lambda: [0.0] * len(COLUMNS))
    for nodeid, values in totals.items():
        _add_columns(files[file_of(nodeid)], values)
    return dict(files)


def file_of(nodeid: str) -> str:
    """The file of a test's node id (`tests/test_a.py::test_b[c]` -> `tests/test_a.py`)."""
    return nodeid.split("::")[0]


def _add_columns(sums: list[float], values) -> None:
    """`values` added to `sums`, column by column, in place."""
    sums[:] = [total + value for total, value in zip(sums, values, strict=True)]


def _row(values) -> str:
    return " ".join(f"{value:7.1f}" for value in values)

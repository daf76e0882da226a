import os
import tempfile

import pytest

# Tests run on the CPU even where an accelerator is visible.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Most of the suite's time is XLA compiling the same small programs again: in every `fastpop
# train` subprocess and for every fresh learner. JAX's persistent compilation cache (shared by
# the subprocesses, which inherit this environment) compiles each once; results are the same.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"fastpop-test-jax-cache-{os.getuid()}"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# And compiles with LLVM's O1 rather than XLA's default O2: ~20% less time for the suite on a
# 2-core CPU, its small programs run as fast, and both sides of every equivalence compile alike.
# Without XLA's MLIR fusion emitters too (as device mode already compiles its env-stepping
# programs: xla_defaults.ENV_STEPPING): their compile is the larger part of a small program's,
# so the suite's cold compiles take less CPU (tests/test_n_step.py 72 -> 50 CPU-s from an
# empty cache; tests/test_learning.py, which trains more than it compiles, 100 -> 92).
# And with each program's LLVM module compiled whole rather than split for parallel threads:
# a split costs CPU of its own, and the suite's workers already keep the cores busy (CONTRIBUTING,
# "Set up, test, check": 6-18% less CPU on six files cold, in alternating rounds).
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", "")]
    + [
        flag
        for flag in (
            "--xla_backend_optimization_level=1",
            "--xla_cpu_use_fusion_emitters=false",
            "--xla_cpu_parallel_codegen_split_count=1",
        )
        if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", "")
    ]
).strip()

# And with most of XLA's optimizations off, but in tests marked `optimized` (tests/optimization.py).
from tests import optimization  # imports no JAX

os.environ.setdefault(optimization.VARIABLE, "1")

# Programs kept traced on disk (fastpop/compilation/stored_programs.py) only where a test asks for
# them (tests/test_stored_programs.py): they follow the compilation cache, which a test calling
# the command line in-process turns on for the rest of its worker, so whether a later in-process
# run used them would depend on the order tests ran in.
os.environ.setdefault("FASTPOP_STORED_PROGRAMS", "0")

from fastpop.gc_settings import tune_for_tracing
from tests import cpu_seconds
from tests.dependencies import ALLOWED_SKIPS, allowed_skip
from tests.runs import trainers  # noqa: F401 (the fixture that starts `fastpop train`)
from tests.shm_leaks import leftovers, shm_entries

# The test processes collect garbage as fastpop's own processes do (less often than CPython's
# default): much of the suite is tracing JAX programs (~10% less time for in-process tests).
tune_for_tracing()

SHM_BEFORE = pytest.StashKey[set]()


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _xdist_worker(session.config):
        session.config.stash[SHM_BEFORE] = shm_entries()
        cpu_seconds.start_session(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The session leaves /dev/shm as it found it: no fastpop segment whose owner is gone and
    no multiprocessing semaphore (`tests/shm_leaks.py`). Checked once, by the process that
    started the session, after every test (and, with pytest-xdist, every worker) is done: a
    worker checking alone could see another worker's run killed on purpose mid-test."""
    if _xdist_worker(session.config):
        return
    left = leftovers(session.config.stash[SHM_BEFORE])
    if left:
        pytest.exit(f"the test session left these in /dev/shm: {left}", returncode=1)


def _fail_unlisted_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    """A skip for anything but what `.[test]` leaves out (tests/dependencies.py) is a failure:
    a skip there would hide a broken install of a package the suite is meant to test."""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if not allowed_skip(reason):
            report.outcome = "failed"
            report.longrepr = (
                f"skipped for a reason not allowed ({reason}): the suite skips only for "
                f"{sorted(ALLOWED_SKIPS)} (tests/dependencies.py, CONTRIBUTING.md 'Skipped tests')"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup` every `xdist_group` test must carry its group in its node id
    (what pytest-xdist schedules by): without it the group's module fixture, the suite's most
    expensive runs, silently ran once per worker (pytest 9.2 with pytest-xdist 3.8)."""
    yield
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [i.nodeid for i in items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(lost)} tests marked xdist_group (e.g. {lost[0]}): "
            "this pytest and pytest-xdist do not work together; see pyproject.toml's test extra"
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    cpu_seconds.add_option(parser)


def pytest_configure(config: pytest.Config) -> None:
    optimization.check_jax_read_the_default()
    config.addinivalue_line(
        "markers", f"{optimization.MARK}: compile with XLA's optimizations (tests/optimization.py)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    with optimization.optimized_if_marked(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    cpu_seconds.start_phase(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    cpu_seconds.start_phase(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    cpu_seconds.start_phase(item)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _fail_unlisted_skip(report)
    cpu_seconds.end_phase(item, report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    cpu_seconds.collect(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    cpu_seconds.summary(terminalreporter, config.getoption("--cpu-seconds"))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_unlisted_skip(outcome.get_result())


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for PyTorch's tiny ops: robust to other test processes sharing the
    cores (the PyTorch baselines' tests use it)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def members_per_chunk_measured_as_a_run_measures(monkeypatch):
    """Each test starts with a run's members-per-chunk rule (measured after the first update
    calls): an in-process `fastpop bench` turns on measuring at the first call for the rest of
    its worker (`chunking.measure_at_first_call`), so a later test's would otherwise depend on
    the order tests ran in."""
    from fastpop.population import chunking

    monkeypatch.setattr(chunking, "_measure_later", True)


@pytest.fixture
def menagerie_models(tmp_path, monkeypatch):
    """Every humanoid joystick robot's folder in a stand-in menagerie: their presets load on a
    machine without the models (which refuses them, saying how to get them: test_playground)."""
    from fastpop.envs import playground_envs

    for robot in set(playground_envs.HUMANOID_JOYSTICKS.values()):
        (tmp_path / "menagerie" / robot / "assets").mkdir(parents=True)
    monkeypatch.setattr(playground_envs, "menagerie_path", lambda: tmp_path / "menagerie")

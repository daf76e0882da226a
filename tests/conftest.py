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

from tests.runs import trainers  # noqa: F401 (the fixture that starts `fastpop train`)
from tests.shm_leaks import leftovers, shm_entries


@pytest.fixture(scope="session", autouse=True)
def shm_left_as_found():
    """The session leaves /dev/shm as it found it: no fastpop segment whose owner is gone and
    no multiprocessing semaphore (`tests/shm_leaks.py`); fails at the last test's teardown."""
    before = shm_entries()
    yield
    left = leftovers(before)
    assert not left, f"the test session left these in /dev/shm: {left}"

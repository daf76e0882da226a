import os
import tempfile

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

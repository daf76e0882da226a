import os

# Tests run on the CPU even where an accelerator is visible.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from tests.runs import trainers  # noqa: F401 (the fixture that starts `fastpop train`)

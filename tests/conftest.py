import os

# Tests run on the CPU even where an accelerator is visible, and see two host devices so
# sharding code paths can be exercised.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

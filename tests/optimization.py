"""How the suite's programs compile: with most of XLA's optimizations off, except in tests
marked `optimized`.

Nearly all of a cold suite's time is compiling (CONTRIBUTING, "Set up, test, check"), and most
tests run each program only a few times: with JAX's `jax_disable_most_optimizations` (LLVM's O0
and none of its expensive passes) a tiny TD3 recipe update compiles in ~0.9 s against ~1.8 s.
A test that trains long enough for its programs' speed to matter (a learning threshold, a
convolution's many updates), or that asserts what XLA's optimizations make of a program (bit
for bit), carries `@pytest.mark.optimized`: its programs, and those of the processes it starts,
compile as before. Either way both sides of an equivalence compile alike."""

from __future__ import annotations

import contextlib
import os

VARIABLE = "JAX_DISABLE_MOST_OPTIMIZATIONS"
FLAG = "jax_disable_most_optimizations"
MARK = "optimized"
TRUE = ("y", "yes", "t", "true", "on", "1")  # the values JAX reads as true


def check_jax_read_the_default() -> None:
    """JAX reads its flag from the environment once, at import: conftest sets the variable
    first, and this fails loudly should a plugin have imported JAX before it."""
    import jax

    wanted = os.environ[VARIABLE].lower() in TRUE  # as JAX reads a boolean variable
    if jax.config.read(FLAG) != wanted:
        raise RuntimeError(f"JAX was imported before tests/conftest.py set {VARIABLE}")


@contextlib.contextmanager
def optimized_if_marked(item):
    """XLA's optimizations on for `item`'s setup, call and teardown if it is marked `optimized`
    (in this process, and for the processes it starts), then back as they were."""
    if item.get_closest_marker(MARK) is None:
        yield
        return
    import jax  # imported here: conftest sets VARIABLE before anything imports JAX

    variable, flag = os.environ.get(VARIABLE), jax.config.read(FLAG)
    os.environ[VARIABLE] = "0"
    jax.config.update(FLAG, False)
    # JAX's in-memory caches are not keyed by the flag: a program an earlier test compiled
    # without optimizations (shared by equal configurations: compilation/shared_programs.py)
    # would run here as it was.
    jax.clear_caches()
    try:
        yield
    finally:
        jax.clear_caches()
        jax.config.update(FLAG, flag)
        if variable is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = variable

"""Every process of a `--distributed` run writes the compilation cache, not process 0 alone.

JAX writes persistent cache entries from process 0 only (to spare remote stores such as GCS
the contention). On the CPU a program's cache key names the devices it runs on, so what
processes 1..N-1 compile for their own devices is never written, and they compile it again on
every rerun and resume while process 0 loads its own: ~12 s of XLA per process for a small
CEM-RL run on 2 cores (results/startup/README.md). Where the cache is a local directory that
JAX reads and writes under its file lock (a size limit is set: fastpop's own cache always has
one), every process writes what it compiled; an entry that exists is left as it is (JAX's
`put` checks under the lock), so the processes of one run never write one file twice. A
user's cache without a size limit, or on a remote store, keeps JAX's rule; so does a GPU,
whose keys leave the device ids out: process 0's entries serve every process there.
"""

from __future__ import annotations

import functools
import inspect
import warnings

# What JAX's `compiler._cache_write` must take for the wrapper to stand in for it.
PARAMETERS = {"cache_key", "compile_time_secs", "module_name", "backend", "executable"}


def install() -> bool:
    """Let this process write the cache it reads (module docstring); whether it now does."""
    import jax
    from jax._src import compiler

    try:
        directory = jax.config.jax_compilation_cache_dir
        locked = jax.config.jax_compilation_cache_max_size != -1  # JAX locks only with a limit
    except AttributeError:  # another JAX than expected: its own rule
        return False
    if not directory or "://" in str(directory) or not locked:
        return False
    original = getattr(compiler, "_cache_write", None)
    if getattr(original, "writes_from_every_process", False):
        return True
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):  # None, or not a function: another JAX than expected
        return False
    if not set(signature.parameters) >= PARAMETERS:
        return False
    compiler._cache_write = _writing_from_every_process(original, signature)
    return True


def _writing_from_every_process(original, signature: inspect.Signature):
    import jax
    from jax._src import compilation_cache, distributed

    @functools.wraps(original)
    def cache_write(*args, **kwargs):
        entry = signature.bind(*args, **kwargs).arguments
        if distributed.global_state.process_id == 0 or entry["backend"].platform == "gpu":
            return original(*args, **kwargs)
        if entry.get("host_callbacks"):  # baked into the program: JAX never stores these
            return None
        if entry["compile_time_secs"] < jax.config.jax_persistent_cache_min_compile_time_secs:
            return None
        try:
            compilation_cache.put_executable_and_time(
                entry["cache_key"],
                entry["module_name"],
                entry["executable"],
                entry["backend"],
                int(entry["compile_time_secs"]),
            )
        except Exception as error:  # as JAX's own write: a cache that fails costs a compile
            warnings.warn(
                f"the compilation cache did not take {entry['module_name']}: "
                f"{type(error).__name__}: {error}",
                stacklevel=2,
            )
        return None

    cache_write.writes_from_every_process = True
    return cache_write

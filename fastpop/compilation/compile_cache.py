"""JAX's persistent compilation cache, on for every fastpop command: a rerun loads the programs
an earlier run compiled instead of compiling them again (a warm start in seconds, not tens).

Where: $FASTPOP_CACHE_DIR/jax-compile (default: $XDG_CACHE_HOME/fastpop, or ~/.cache/fastpop,
the directory of the tuning cache), one file per compiled program (XLA's serialized
executable, compressed) plus its last-use time. It is bounded: JAX evicts the least recently
used programs past FASTPOP_COMPILE_CACHE_MAX_BYTES (default 1 GiB), under a file lock that also
makes concurrent runs and their processes (spawned collectors, `--distributed` processes)
read and write it safely (every `--distributed` process writes: every_process_writes.py).
Off: FASTPOP_COMPILE_CACHE=0 or FASTPOP_CACHE_DIR="" (from the start), or the config's
`train.compile_cache: false` (from the moment the run is built: the few small programs that
checking the config compiles may still use it). A user's own JAX_COMPILATION_CACHE_DIR wins:
fastpop then changes none of JAX's cache settings and never evicts anything there (given a
size limit of the user's, every `--distributed` process writes it too).

Every program is kept, however fast it compiled (JAX's default keeps only those over 1 s):
fastpop's start-up compiles dozens of programs of 0.05-1 s each (initializers, evaluation,
replay, strategy and checkpoint helpers), which together cost seconds; loading one costs
milliseconds. JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS set by the user wins.

The settings go into the environment as well as into JAX's config, so that processes this one
spawns (which read them when they import JAX) use the same cache. An entry JAX cannot read (a
truncated file after a crash, say) is compiled again with a warning, never an error.
"""

from __future__ import annotations

import os
from pathlib import Path

SWITCH = "FASTPOP_COMPILE_CACHE"
MAX_BYTES_VARIABLE = "FASTPOP_COMPILE_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
MIN_COMPILE_SECONDS = 0.0
DIRECTORY_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
# Set by `enable` in the environment the processes of this run inherit: the directory named by
# JAX_COMPILATION_CACHE_DIR is then fastpop's own, not a user's.
OWNED_VARIABLE = "FASTPOP_COMPILE_CACHE_OWNED"

_status = "not configured"


def user_cache_dir() -> Path | None:
    """fastpop's cache directory ($FASTPOP_CACHE_DIR, else $XDG_CACHE_HOME/fastpop or
    ~/.cache/fastpop); None where FASTPOP_CACHE_DIR is set empty (nothing kept on disk)."""
    directory = os.environ.get("FASTPOP_CACHE_DIR")
    if directory is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "fastpop")
    return Path(directory) if directory else None


def owned_directory() -> Path | None:
    base = user_cache_dir()
    return None if base is None else base / "jax-compile"


def status() -> str:
    """What this process's cache is: "<dir> (fastpop's|yours)" or "off (<why>)"."""
    return _status


def is_on() -> bool:
    """Whether this process compiles into a persistent cache (fastpop's or the user's)."""
    return not _status.startswith(("off", "not configured"))


def _max_bytes() -> int:
    value = os.environ.get(MAX_BYTES_VARIABLE, "")
    try:
        return int(float(value)) if value else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


def _set(name: str, variable: str, value) -> None:
    import jax

    os.environ[variable] = str(value)
    jax.config.update(name, value)


def enable() -> str:
    """Turn the cache on for this process and the processes it starts (before the first compile:
    JAX opens its cache once); returns `status()`."""
    global _status
    user_dir = os.environ.get(DIRECTORY_VARIABLE)
    if user_dir and os.environ.get(OWNED_VARIABLE) != user_dir:
        _status = f"{user_dir} (yours: JAX_COMPILATION_CACHE_DIR)"
        return _status
    directory = owned_directory()
    if os.environ.get(SWITCH, "1") == "0" or directory is None:
        why = f"{SWITCH}=0" if directory is not None else 'FASTPOP_CACHE_DIR=""'
        return disable(why)
    try:
        import filelock  # noqa: F401 (JAX's size limit needs it)
    except ImportError:
        return disable("the filelock package is missing: pip install filelock")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return disable(f"{directory}: {error.strerror}")
    _tidy(directory)
    _set("jax_compilation_cache_dir", DIRECTORY_VARIABLE, str(directory))
    os.environ[OWNED_VARIABLE] = str(directory)
    _set("jax_compilation_cache_max_size", "JAX_COMPILATION_CACHE_MAX_SIZE", _max_bytes())
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        _set(
            "jax_persistent_cache_min_compile_time_secs",
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
            MIN_COMPILE_SECONDS,
        )
    _status = f"{directory} (fastpop's)"
    return _status


def disable(why: str) -> str:
    """Turn off the cache fastpop set (a user's JAX_COMPILATION_CACHE_DIR stays as it is), for
    this process's later compiles and the processes it starts from now on."""
    global _status
    directory = os.environ.get(DIRECTORY_VARIABLE)
    if directory and directory != os.environ.get(OWNED_VARIABLE):
        return _status  # a user's own cache: theirs to turn off
    if directory:
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        del os.environ[DIRECTORY_VARIABLE], os.environ[OWNED_VARIABLE]
        jax.config.update("jax_compilation_cache_dir", None)
        compilation_cache.reset_cache()  # JAX opened it at the first compile: close it
    _status = f"off ({why})"
    return _status


def _tidy(directory: Path) -> None:
    """Drop half-written pairs (a program without its last-use time, or the reverse: a process
    killed between JAX's two writes), which would make every later eviction fail; under JAX's
    own lock, skipped if another process holds it."""
    import filelock

    try:
        with filelock.FileLock(directory / ".lockfile", timeout=0.5):
            names = set(os.listdir(directory))
            for name in names:
                stem, _, kind = name.rpartition("-")
                partner = {"cache": f"{stem}-atime", "atime": f"{stem}-cache"}.get(kind)
                if stem and partner and partner not in names:
                    (directory / name).unlink(missing_ok=True)
    except (filelock.Timeout, OSError):
        pass

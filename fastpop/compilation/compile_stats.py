"""How many programs this process compiled, how many came from the persistent cache, and the
seconds spent tracing, lowering and compiling them: read from the events JAX records
(`jax.monitoring`), so nothing is timed twice. `summary.json` carries `counts()` under
"compiles"; `fastpop train --verbose` also names each program as it is compiled.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

BACKEND = "/jax/core/compile/backend_compile_duration"  # per program, cache hit or not
TRACE = "/jax/core/compile/jaxpr_trace_duration"
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
CACHE_WRITE = "/jax/compilation_cache/cache_misses"  # JAX counts an entry written as a miss

_lock = threading.Lock()
_totals: Counter = Counter()
_names: Counter = Counter()
_installed = False
_announce = None  # a callable(str) while --verbose
_started = time.monotonic()


def _on_event(event: str, **_) -> None:
    if event in (CACHE_HIT, CACHE_WRITE):
        with _lock:
            _totals[event] += 1


def _on_duration(event: str, seconds: float, **fields) -> None:
    if event not in (BACKEND, TRACE, LOWER):
        return
    with _lock:
        _totals[event] += 1
        _totals[event + ":seconds"] += seconds
        if event == BACKEND:
            _names[fields.get("fun_name", "?")] += 1
    if event == BACKEND and _announce is not None:
        _announce(
            f"[compile {time.monotonic() - _started:6.1f}s] {fields.get('fun_name', '?')}: "
            f"{seconds:.2f}s"
        )


def install(announce=None) -> None:
    """Start counting (once per process); `announce(line)` is called for every program."""
    global _installed, _announce
    _announce = announce or _announce
    if _installed:
        return
    import jax.monitoring

    jax.monitoring.register_event_listener(_on_event)
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _installed = True


def counts() -> dict:
    """Programs compiled or loaded so far in this process (summary.json's "compiles")."""
    with _lock:
        programs, hits = _totals[BACKEND], _totals[CACHE_HIT]
        repeated = {name: n for name, n in _names.most_common() if n > 1}
        return {
            "programs": programs,
            "from_cache": hits,
            "compiled": programs - hits,
            "cache_writes": _totals[CACHE_WRITE],
            "compile_seconds": round(_totals[BACKEND + ":seconds"], 2),
            "trace_seconds": round(_totals[TRACE + ":seconds"], 2),
            "lower_seconds": round(_totals[LOWER + ":seconds"], 2),
            "names_compiled_more_than_once": dict(list(repeated.items())[:10]),
        }


def summary() -> dict:
    """summary.json's "compiles": `counts()`, the cache this process used and the stored
    programs it loaded or wrote."""
    from fastpop.compilation import compile_cache, program_store

    return counts() | {"cache": compile_cache.status(), "stored_programs": program_store.counts()}

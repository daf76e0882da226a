"""MuJoCo MJX imported without NVIDIA Warp, for brax and Playground.

`import mujoco.mjx` (which `import brax` and `import mujoco_playground` both do) also imports
NVIDIA Warp and MuJoCo Warp for MJX's Warp pipeline: ~1.4 s of a rerun's start-up on the 2-core
CPU (a warm brax run reached its first update in 5.7 s with them, 3.9 s without). fastpop never
runs that pipeline (brax runs its own, Playground envs load with `impl: jax`), so where neither
MJX nor Warp is loaded yet, MJX is imported with Warp hidden: MJX then offers its JAX pipeline
alone, as on a machine without warp-lang. Warp itself stays importable afterwards.
`FASTPOP_MJX_WARP=1` imports MJX as it comes (for code that runs MJX's Warp pipeline in the same
process).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
import sys
import warnings

KEEP_WARP = "FASTPOP_MJX_WARP"


@functools.cache
def import_mjx() -> None:
    """Imports mujoco.mjx once per process (Warp hidden unless `FASTPOP_MJX_WARP=1` or already
    loaded), its "Failed to import warp" lines and jaxopt's deprecation warning silenced. A
    no-op without mujoco-mjx."""
    if "mujoco.mjx" in sys.modules or importlib.util.find_spec("mujoco") is None:
        return
    if importlib.util.find_spec("mujoco.mjx") is None:
        return
    hide = os.environ.get(KEEP_WARP) != "1" and "warp" not in sys.modules
    if hide:
        sys.modules["warp"] = None  # an ImportError for `import warp`, which MJX catches
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import mujoco.mjx  # noqa: F401
    finally:
        if hide and sys.modules.get("warp", 0) is None:
            del sys.modules["warp"]

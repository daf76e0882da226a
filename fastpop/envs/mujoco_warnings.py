"""MuJoCo's warnings as MuJoCo prints them, less the ones about gymnasium's own model files.

gymnasium's HalfCheetah model uses `settotalmass`, which MuJoCo 3.3+ calls deprecated each time
the model is compiled: once per collector process, 17 times for a run with 16 collectors and an
evaluator. Nothing a user of fastpop can change, so it is not printed; every other MuJoCo
warning still goes to stderr, worded as MuJoCo's own handler words it.
"""

from __future__ import annotations

import functools
import sys

# Starts of warnings about gymnasium's bundled assets, not about anything the user chose.
ASSET_DEPRECATIONS = ("compiler attribute 'settotalmass' is deprecated",)


def _print_unless_asset_deprecation(message: str) -> None:
    if not message.startswith(ASSET_DEPRECATIONS):
        print(f"WARNING: {message}", file=sys.stderr, flush=True)


@functools.cache
def hide_asset_deprecations() -> None:
    """Installs the handler in this process (once; before a model is compiled)."""
    import mujoco

    mujoco.set_mju_user_warning(_print_unless_asset_deprecation)

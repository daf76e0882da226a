"""MuJoCo MJX imported without NVIDIA Warp for brax (fastpop/envs/mjx_import.py): Warp is not
loaded by brax's import, stays importable afterwards, and FASTPOP_MJX_WARP=1 keeps MJX's own
import. Each case in a fresh interpreter (this one may have imported MJX already)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.dependencies import require

require("brax")
require("warp")  # playground brings warp-lang: what envs/mjx_import.py hides

PROBE = """
import json, sys
from fastpop.envs import brax_envs
brax_envs.known_names()  # imports brax.envs
import mujoco.mjx.warp as mjx_warp
loaded_by_brax = "warp" in sys.modules
import warp
print(json.dumps({"loaded_by_brax": loaded_by_brax, "mjx_sees_warp": mjx_warp.WARP_INSTALLED,
                  "importable_after": warp.__name__ == "warp"}))
"""


def probe(**environ: str) -> dict:
    env = {**os.environ, **environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_brax_imports_mjx_without_warp_which_stays_importable():
    assert probe() == {"loaded_by_brax": False, "mjx_sees_warp": False, "importable_after": True}


def test_fastpop_mjx_warp_1_keeps_mjx_own_import():
    seen = probe(FASTPOP_MJX_WARP="1")
    assert seen == {"loaded_by_brax": True, "mjx_sees_warp": True, "importable_after": True}

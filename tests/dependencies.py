"""What the suite may skip, and the `test` extra's packages imported so that a missing one fails.

`python -m pip install -e ".[test]"` installs every package the suite needs except those listed
in ALLOWED_SKIPS (CONTRIBUTING.md, "Skipped tests", says why each is left out). A test that needs
a `test` package imports it with `require`: a broken or missing install is an error naming the
package, never a skip that hides it (gymnax 0.0.9 once needed an undeclared `six`, and nine test
modules skipped themselves on a fresh machine). tests/conftest.py turns any other skip into a
failure.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# A skip's reason must contain one of these; each names what `.[test]` deliberately leaves out.
ALLOWED_SKIPS = {
    "torch": "the PyTorch baseline (`.[torch]`): a CPU wheel of hundreds of MB, benchmarks only",
    "the video extra": "`fastpop eval --video` (`.[video]`): imageio-ffmpeg bundles ffmpeg",
    "cannot render offscreen": "MuJoCo video needs an OpenGL backend (EGL/OSMesa) the OS provides",
    "pygame renders": "a check of the error for an env that cannot render, where pygame can",
}


def require(module: str) -> ModuleType:
    """`module`, which the `test` extra installs; ImportError naming it and the fix if absent."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{module!r} cannot be imported ({type(error).__name__}: {error}); fastpop's `test` "
            'extra installs it, so the suite needs it: python -m pip install -e ".[test]"'
        ) from error


def allowed_skip(reason: str) -> bool:
    return any(allowed in reason for allowed in ALLOWED_SKIPS)

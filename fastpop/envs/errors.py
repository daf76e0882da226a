"""The two ways an environment id is refused, shared by gymnasium (gymnasium_envs.py) and the
device families (brax_envs.py, gymnax_envs.py, playground_envs.py); both are ValueErrors whose
message is shown to the user as it is. The families' messages are built by the helpers below."""

from __future__ import annotations

import difflib


class UnknownEnvironment(ValueError):
    """An environment id that is neither registered (gymnasium, brax) nor an Atari game."""


class MissingExtra(ValueError):
    """A valid environment id whose simulator (an optional dependency) is not installed."""


def close_names(key: str, by_key: dict[str, str], prefix: str) -> str:
    """'did you mean <prefix>a, <prefix>b? ' for up to 3 known names whose key (in `by_key`,
    key -> name) is close to `key`; '' if none is."""
    close = difflib.get_close_matches(key, by_key, n=3, cutoff=0.6)
    return f"did you mean {', '.join(prefix + by_key[k] for k in close)}? " if close else ""


def missing_extra(env_id: str, package: str, install: str) -> MissingExtra:
    return MissingExtra(
        f"environment {env_id!r} needs the {package!r} package, which is not installed; "
        f"install it with {install}"
    )

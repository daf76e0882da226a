"""The two ways an environment id is refused, shared by gymnasium (gymnasium_envs.py) and brax ids
(brax_envs.py); both are ValueErrors whose message is shown to the user as it is."""

from __future__ import annotations


class UnknownEnvironment(ValueError):
    """An environment id that is neither registered (gymnasium, brax) nor an Atari game."""


class MissingExtra(ValueError):
    """A valid environment id whose simulator (an optional dependency) is not installed."""

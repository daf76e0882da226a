"""Argument types and the error exit shared by the `fastpop` commands.

Kept apart from `cli.py` so that the command modules (`evaluate.py`, `bench.py`, ...)
can use them without importing the command line that imports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def comma_list(parse_item: Callable[[str], object], what: str, allowed: Sequence | None = None):
    """argparse type for 'a,b,c' lists; bad items give a message naming what is allowed."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {what} list")
        values = []
        for item in items:
            try:
                value = parse_item(item)
            except ValueError as error:
                raise argparse.ArgumentTypeError(f"{what} {item!r}: {error}") from None
            if allowed is not None and value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"unknown {what} {item!r}; choose from {', '.join(allowed)}"
                )
            values.append(value)
        return values

    return parse


def one_of(what: str, allowed: Sequence[str]):
    """argparse type for one choice, with the same message on every Python version."""

    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; choose from {', '.join(allowed)}"
            )
        return text

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not an integer") from None
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def positive_int_arg(what: str):
    def parse(text: str) -> int:
        try:
            return positive_int(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: {error}") from None

    return parse


def fail(message: str, code: int = 2) -> int:
    """Print `message` as fastpop's error and return the exit code (2: bad input)."""
    print(f"fastpop: error: {message}", file=sys.stderr)
    return code


def warn(message: str) -> None:
    """Print `message` as fastpop's warning (the command goes on)."""
    print(f"fastpop: warning: {message}", file=sys.stderr)

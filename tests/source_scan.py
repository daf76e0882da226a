"""Where fastpop's code names a built-in algorithm or strategy as a string constant: the
registries' tests fail on any such name outside the places allowed to write one."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fastpop"


def name_literals(path: Path, names: Iterable[str]) -> list[str]:
    """Each string constant of `path` that is exactly one of `names`, with its line:
    docstrings, comments and longer strings (help texts, messages, file names) are not names
    in code."""
    names = set(names)
    return [
        f"{path}:{node.lineno}: {node.value!r}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in names
    ]


def names_outside(names: Iterable[str], allowed: tuple[str, ...]) -> list[str]:
    """`name_literals` of every module of fastpop/ whose path (under fastpop/) does not start
    with one of `allowed`."""
    names = set(names)
    return [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if not path.relative_to(PACKAGE).as_posix().startswith(allowed)
        for hit in name_literals(path, names)
    ]

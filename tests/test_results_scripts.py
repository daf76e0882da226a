"""The scripts under results/ that made the published figures name only what fastpop still has:
every `from fastpop... import ...` in them, and in the Python they run in fresh processes
(string constants holding code), resolves. A rename in fastpop/ that leaves a script behind
fails here, not on the next person who reruns a figure."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "results"
SCRIPTS = sorted(RESULTS.rglob("*.py"))


def fastpop_imports(tree: ast.AST) -> list[tuple[str, str | None]]:
    """(module, name) for each fastpop import in `tree`, name None for `import fastpop.x`; not
    those in an `except` block (a script's fallback for older checkouts it compares with)."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastpop"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("fastpop")]
        elif not isinstance(node, ast.ExceptHandler):
            found += fastpop_imports(node)
    return found


def embedded_code(tree: ast.AST) -> list[ast.AST]:
    """String constants that are Python importing fastpop (scripts run them with `python -c`)."""
    trees = []
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and "import" in text and "fastpop" in text:
            try:
                trees.append(ast.parse(text))
            except SyntaxError:
                continue  # prose or a command line, not code
    return trees


def test_results_has_scripts():
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_script_imports_resolve(script):
    tree = ast.parse(script.read_text(), filename=str(script))
    missing = []
    for code in [tree, *embedded_code(tree)]:
        for module, name in fastpop_imports(code):
            try:
                imported = importlib.import_module(module)
            except ModuleNotFoundError:
                missing.append(module)
                continue
            if name is not None and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ModuleNotFoundError:
                    missing.append(f"{module}.{name}")
    assert not missing, f"{script.relative_to(RESULTS)} imports what fastpop lacks: {missing}"

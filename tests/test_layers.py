"""The package is built in layers (CONTRIBUTING.md, "Layers"): a module imports only modules of
its own layer or of a layer listed before it, lazy imports included. The order is read from
CONTRIBUTING.md itself, so the page and this check cannot disagree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "fastpop"
ENTRY = {"fastpop.__main__"}  # `python -m fastpop` starts the command line: above every layer


def layer_order() -> list[str]:
    """The layers, lowest first, from the numbered list under CONTRIBUTING.md's "## Layers"."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([a-z_]+)/?`", section, flags=re.M)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """`fastpop.types` -> root; `fastpop.run.loop` and `fastpop.run` -> run."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "root"


def imported_modules(path: Path) -> set[str]:
    """Every fastpop module `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("fastpop")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastpop"):
            assert node.level == 0, f"{path}: relative import"
            for alias in node.names:  # `from fastpop import run` names a package, not a name
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).is_dir() or (
                    PACKAGE.parent / (candidate.replace(".", "/") + ".py")
                ).is_file()
                found.add(candidate if is_module else node.module)
    return found


def test_contributing_lists_every_layer_once():
    order = layer_order()
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert order[0] == "root"
    assert len(order) == len(set(order)), order
    assert set(order) == packages | {"root"}, "CONTRIBUTING.md's layers and fastpop/ differ"


def test_every_import_goes_to_the_same_layer_or_a_lower_one():
    rank = {layer: index for index, layer in enumerate(layer_order())}
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        if importer in ENTRY:
            continue
        for imported in imported_modules(path):
            if rank[layer_of(imported)] > rank[layer_of(importer)]:
                upward.append(f"{importer} ({layer_of(importer)}) imports {imported}")
    assert not upward, "imports going up a layer:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    """The check above cannot pass vacuously: a lazy import of the loop from envs/ is seen."""
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from fastpop.run import loop\n    from fastpop import envs\n")
    assert imported_modules(source) == {"fastpop.run.loop", "fastpop.envs"}
    rank = {layer: index for index, layer in enumerate(layer_order())}
    assert rank[layer_of("fastpop.run.loop")] > rank[layer_of("fastpop.envs.errors")]


def test_every_file_the_contributors_page_names_exists():
    """The two paths name files by path (`learn/learner.py`, from fastpop/ or the repository),
    the layer map by name within their package: a file moved or renamed without the page
    following fails here."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", text))
    files = {path.name for path in PACKAGE.rglob("*.py")}
    missing = [
        name
        for name in sorted(named)
        if not (
            ((PACKAGE / name).is_file() or (REPO / name).is_file())
            if "/" in name
            else name in files
        )
    ]
    assert len(named) > 30 and not missing, missing


def test_the_learner_and_the_collectors_read_no_config_but_their_sections():
    """The layers above the config are handed their pieces when a run is built (run/parts.py):
    of the config package, learn/ and collect/ import at most `fastpop.config.sections`, for a
    section's type (a spawned worker rebuilds its agent from an `AgentRecipe`, not the config)."""
    readers = [
        f"{module_name(path)} imports {imported}"
        for package in ("learn", "collect")
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for imported in imported_modules(path)
        if layer_of(imported) == "config" and imported != "fastpop.config.sections"
    ]
    assert not readers, "reading the config below run/:\n" + "\n".join(readers)

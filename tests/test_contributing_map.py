"""CONTRIBUTING.md's map of the package (its "## Layers" list) names every module, and only
modules that exist (issue 48).

Each numbered entry (6. `strategies/` — ...) names the modules of its package folder by file
name (`cem.py`); the first entry, `root`, names the modules directly in fastpop/. The rules:

- every fastpop/**/*.py module but a package's `__init__.py` is named in the entry of its own
  package folder (a package's `__init__.py` is what the entry's heading, `strategies/`, names);
- a bare file name in an entry is a module of that entry's folder: one that is not there fails
  (a module removed or renamed without the map following it);
- a name with a folder (`fastpop/types.py`, `tests/test_portability.py`) is a path from fastpop/
  or from the repository, and must exist; it names a module for the entry only where it is one of
  that entry's folder.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT_ENTRY = "root"
ENTRY_START = re.compile(r"^(\d+)\. `([a-z_]+)/?`", flags=re.M)
# A file name anywhere in an entry, in backticks or not, with or without folders before it.
FILE_NAME = re.compile(r"(?<![\w/.])((?:[A-Za-z0-9_]+/)*[A-Za-z0-9_]+\.py)(?!\w)")


def map_entries(contributing: str) -> dict[str, tuple[str, str]]:
    """folder ('root' or a package's name) -> (the entry's heading, its text), from the numbered
    list under "## Layers"; the list ends at the first blank line after its first entry."""
    section = contributing.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    starts = list(ENTRY_START.finditer(section))
    assert starts, "CONTRIBUTING.md's Layers section has no numbered entries"
    end_of_list = section.find("\n\n", starts[0].start())
    end_of_list = len(section) if end_of_list < 0 else end_of_list
    entries = {}
    for index, start in enumerate(starts):
        stop = starts[index + 1].start() if index + 1 < len(starts) else end_of_list
        heading = start.group(0)  # as the map writes it: "1. `root`", "6. `strategies/`"
        assert start.group(2) not in entries, f"two map entries for {start.group(2)}"
        entries[start.group(2)] = (heading, section[start.start() : stop])
    return entries


def folder_of(module: Path, package: Path) -> tuple[str, str]:
    """(its map entry's folder, its name within that folder): fastpop/strategies/cem.py ->
    ('strategies', 'cem.py'); fastpop/types.py -> ('root', 'types.py')."""
    parts = module.relative_to(package).parts
    if len(parts) == 1:
        return ROOT_ENTRY, parts[0]
    return parts[0], "/".join(parts[1:])


def map_problems(contributing: str, package: Path, repo: Path) -> list[str]:
    """One line per name in the map that is no file, then one per module the map leaves out."""
    entries = map_entries(contributing)
    unnamed = {}  # folder -> names of its modules no entry of the folder has named yet
    for path in sorted(package.rglob("*.py")):
        if path.name != "__init__.py":
            folder, name = folder_of(path, package)
            unnamed.setdefault(folder, set()).add(name)
    problems = []
    for folder, (heading, text) in entries.items():
        base = package if folder == ROOT_ENTRY else package / folder
        for name in sorted(set(FILE_NAME.findall(text))):
            if "/" not in name:
                path = base / name
                if not path.is_file():
                    problems.append(
                        f"entry {heading} names `{name}`, but {path.relative_to(repo)} does not "
                        "exist: drop it from the entry, or name the module it became"
                    )
                    continue
            else:
                found = [path for path in (package / name, repo / name) if path.is_file()]
                if not found:
                    problems.append(
                        f"entry {heading} names `{name}`, which is no file under fastpop/ or "
                        "the repository"
                    )
                    continue
                path = found[0]
            if path.resolve().is_relative_to(package.resolve()):
                named_folder, named = folder_of(path.resolve(), package.resolve())
                if named_folder == folder:
                    unnamed.get(folder, set()).discard(named)
    for folder, names in sorted(unnamed.items()):
        if names and folder not in entries:
            problems.append(
                f"fastpop/{folder}/ has no numbered entry in CONTRIBUTING.md's Layers: add one "
                f"naming {', '.join(f'`{name}`' for name in sorted(names))}"
            )
            continue
        for name in sorted(names):
            path = (package if folder == ROOT_ENTRY else package / folder) / name
            problems.append(
                f"{path.relative_to(repo)} is not in the map: name `{name}` in entry "
                f"{entries[folder][0]} with a short phrase saying what it holds"
            )
    return problems


def test_the_map_names_every_module_and_only_modules():
    problems = map_problems((REPO / "CONTRIBUTING.md").read_text(), REPO / "fastpop", REPO)
    assert not problems, "CONTRIBUTING.md's map (## Layers) and fastpop/ differ:\n" + "\n".join(
        problems
    )


def test_the_map_check_sees_a_missing_module_and_a_stale_name(tmp_path):
    """The check cannot pass vacuously: a module named only in another package's entry, only
    without `.py` or only outside the list is missing, and so is a package without an entry; a
    name of no file is stale; names with a folder resolve from fastpop/ or the repository."""
    package = tmp_path / "fastpop"
    for module in (
        "__init__.py",
        "__main__.py",
        "types.py",
        "a/__init__.py",
        "a/one.py",
        "a/two.py",
        "b/__init__.py",
        "b/three.py",
        "b/four.py",
        "c/__init__.py",
        "c/five.py",
    ):
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    contributing = (
        "# Title\n\n## Layers\n\nThe list.\n\n"
        "1. `root` — `fastpop/__init__.py`, `types.py`.\n"
        "2. `a/` — `one.py` (uses `fastpop/types.py`, `tests/test_x.py`), `three.py`, two.\n"
        "3. `b/` — `b/four.py`, `gone.py`, `b/five.py`.\n\n"
        "`three.py` after the list counts for no entry.\n\n## Next\n\n`two.py`\n"
    )
    assert map_problems(contributing, package, tmp_path) == [
        "entry 2. `a/` names `three.py`, but fastpop/a/three.py does not exist: "
        "drop it from the entry, or name the module it became",
        "entry 3. `b/` names `b/five.py`, which is no file under fastpop/ or the repository",
        "entry 3. `b/` names `gone.py`, but fastpop/b/gone.py does not exist: "
        "drop it from the entry, or name the module it became",
        "fastpop/a/two.py is not in the map: name `two.py` in entry 2. `a/` "
        "with a short phrase saying what it holds",
        "fastpop/b/three.py is not in the map: name `three.py` in entry 3. `b/` "
        "with a short phrase saying what it holds",
        "fastpop/c/ has no numbered entry in CONTRIBUTING.md's Layers: add one naming `five.py`",
        "fastpop/__main__.py is not in the map: name `__main__.py` in entry 1. `root` "
        "with a short phrase saying what it holds",
    ]

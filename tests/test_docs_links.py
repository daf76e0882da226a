"""The Markdown pages' relative links resolve, and the README stays a front page: short, with
the two commands verbatim and a link to every page of the user guide in docs/."""

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

# [text](target) and ![alt](target), an optional "title" after the target; the text may hold
# one level of brackets and run over several lines.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)[^`]+?\1")
EXTERNAL = ("http://", "https://", "mailto:")

TWO_COMMANDS = (
    "python -m pip install -e . && fastpop train configs/td3_pendulum_cpu.yaml",
    'python -m pip install -e ".[test]" && python -m pytest',
)


def markdown_pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "results").rglob("README.md"))
    return [page for page in pages if page.is_file()]


def blanked(match: re.Match) -> str:
    """The match as spaces, its line breaks kept (so offsets keep their line numbers)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside fenced code blocks and code spans."""
    lines, fenced = [], False
    for line in text.splitlines():
        fence = line.lstrip().startswith("```")
        lines.append("" if fenced or fence else line)
        fenced = fenced != fence
    prose = "\n".join(lines)
    prose = CODE_SPAN.sub(lambda match: "c" + blanked(match)[1:], prose)
    return [
        (prose.count("\n", 0, match.start()) + 1, match.group(1)) for match in LINK.finditer(prose)
    ]


def relative_targets(page: Path) -> list[tuple[int, str]]:
    return [
        (number, target)
        for number, target in links(page.read_text(encoding="utf-8"))
        if not target.startswith(EXTERNAL) and not target.startswith("#")
    ]


def test_the_link_parser_finds_links_and_images_but_not_code():
    text = (
        'See [`a/b.md`](a/b.md#part) and ![plot](p.png "title"), [x](https://e.org).\n'
        "`[not](a-link.md)` here\n"
        "```\n[not](in-a-block.md)\n```\n"
        "  ```python\n  x[i](y)\n  ```\n"
        "[a [nested] text](c.md)\n"
        "a [link over\ntwo lines](d.md), `a code span\nover two [lines](e.md)`\n"
    )
    assert links(text) == [
        (1, "a/b.md#part"),
        (1, "p.png"),
        (1, "https://e.org"),
        (9, "c.md"),
        (10, "d.md"),
    ]


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for number, target in relative_targets(page):
        path = unquote(target.split("#", 1)[0])
        if not (page.parent / path).exists():
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_readme_is_a_front_page():
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert readme.stat().st_size < 12_000, f"README.md is {readme.stat().st_size} bytes"
    for command in TWO_COMMANDS:
        assert f"```bash\n{command}\n```" in text, f"not verbatim in a bash block: {command}"
    linked = {
        (ROOT / unquote(target.split("#", 1)[0])).resolve()
        for _, target in relative_targets(readme)
    }
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages, "docs/ holds no pages"
    missing = [str(page.relative_to(ROOT)) for page in pages if page.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_every_docs_page_has_a_title_line():
    for page in sorted((ROOT / "docs").glob("*.md")):
        first = page.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith("# "), f"{page.relative_to(ROOT)} starts with {first!r}"

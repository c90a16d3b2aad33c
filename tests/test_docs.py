"""The project's documentation stands alone: every `docs/<page>.md §N` citation in code, tests,
configs and docs resolves to a heading of that page, markdown links point at files that exist,
and nothing in the repository points outside it (a user who clones it must find what it cites)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".ipynb", ".txt", ".sh", ".cfg", ".ini"}
SKIP_PARTS = {".git", "runs", "__pycache__", ".pytest_cache", ".ipynb_checkpoints"}

PAGES = {p.stem: p for p in DOCS.glob("*.md")}
# A page mention (`docs/protocol.md`, `protocol.md`, `[protocol.md](protocol.md)`) or a section
# reference (`§3`, `§1.5`, `§3.3-3.4`).
TOKEN = re.compile(r"(?P<page>\b(?P<stem>[a-z_]+)\.md\b)|§(?P<sec>\d+(?:\.\d+)*)(?:-(?P<sec2>\d+(?:\.\d+)*))?")
HEADING = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)[.\s]", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Where the project's notes used to live, and the machine paths of the development setup.
OUTSIDE = ("../shared", "/work/", "shared/docs", "DESIGN.md", "SGLANG_PROTOCOL")


def repo_files() -> list[Path]:
    """Tracked text files (git), or every text file under the repository without git."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        paths = [REPO / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in REPO.rglob("*") if p.is_file()]
    keep = [p for p in paths if not SKIP_PARTS & set(p.relative_to(REPO).parts)]
    return [p for p in keep if (p.suffix in TEXT_SUFFIXES or p.name == "run") and p.is_file()]


def section_numbers(page: Path) -> set[str]:
    return set(HEADING.findall(page.read_text()))


def citations(path: Path) -> list[tuple[int, str, str]]:
    """(line, page stem, section) for every § in the file. Outside docs/, a bare §N refers to the
    page most recently named in the file (modules name the page once, in their docstring); inside
    a docs page it refers to the page itself unless another page is named earlier on the line."""
    own = path.stem if path.parent == DOCS else None
    found, page = [], own
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if own is not None:
            page = own
        for m in TOKEN.finditer(line):
            if m["page"]:
                if m["stem"] in PAGES:
                    page = m["stem"]
                continue
            for sec in (m["sec"], m["sec2"]):
                if sec:
                    found.append((lineno, page, sec))
    return found


def test_docs_pages_exist():
    assert {"architecture", "protocol"} <= set(PAGES), sorted(PAGES)


def test_every_section_citation_resolves_to_a_heading():
    headings = {stem: section_numbers(p) for stem, p in PAGES.items()}
    bad, checked = [], 0
    for path in repo_files():
        if path == Path(__file__).resolve():
            continue
        for lineno, page, sec in citations(path):
            where = f"{path.relative_to(REPO)}:{lineno} §{sec}"
            if page is None:
                bad.append(f"{where}: no docs page named before it (write `docs/<page>.md §{sec}` once)")
            elif sec not in headings[page]:
                bad.append(f"{where}: docs/{page}.md has no heading numbered {sec}")
            checked += 1
    assert checked > 50, f"only {checked} citations found: is the citation pattern still the one the code uses?"
    assert not bad, "\n".join(bad)


def test_markdown_links_point_at_files_in_the_repository():
    bad = []
    for path in repo_files():
        if path.suffix != ".md":
            continue
        for m in LINK.finditer(path.read_text()):
            target = m[1].split("#", 1)[0]
            if not target or re.match(r"[a-z]+:", target):  # an anchor or a URL
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.exists() or REPO not in resolved.parents:
                bad.append(f"{path.relative_to(REPO)}: {m[1]}")
    assert not bad, "\n".join(bad)


def test_nothing_points_outside_the_repository():
    bad = []
    for path in repo_files():
        if path == Path(__file__).resolve():
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            bad += [f"{path.relative_to(REPO)}:{lineno}: {s!r}" for s in OUTSIDE if s in line]
    assert not bad, "\n".join(bad)


def test_citation_parser_attributes_bare_sections_to_the_named_page(tmp_path):
    # The parser itself: a wrong attribution would let a dangling citation through.
    f = tmp_path / "m.py"
    f.write_text('"""See docs/protocol.md §1.5 and §3.3-3.4."""\n# later: §6, and architecture.md §5\nx = 1  # §2\n')
    assert citations(f) == [
        (1, "protocol", "1.5"),
        (1, "protocol", "3.3"),
        (1, "protocol", "3.4"),
        (2, "protocol", "6"),
        (2, "architecture", "5"),
        (3, "architecture", "2"),
    ]
    g = tmp_path / "n.py"
    g.write_text("# §4 without a page\n")
    assert citations(g) == [(1, None, "4")]


def test_tests_readme_names_every_test_file_and_only_files_that_exist():
    """tests/README.md is where a newcomer finds the tests of a module: it names every test file,
    and every test file it names exists."""
    tests = REPO / "tests"
    named = {m for m in re.findall(r"`([\w/]+\.py)`", (tests / "README.md").read_text()) if "test_" in m}
    present = {str(p.relative_to(tests)) for p in tests.rglob("test_*.py")}
    assert not present - named, f"add to tests/README.md: {sorted(present - named)}"
    assert not named - present, f"tests/README.md names files that do not exist: {sorted(named - present)}"


README_MAX_LINES = 250


def test_readme_is_a_front_door():
    """The README says what arealite is, how to install and run it, and where to read on; results,
    job figures and explanations live on the pages it links (issue 60), so it stays short."""
    n = len((REPO / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to the docs/ page it links"
    )

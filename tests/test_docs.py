"""The project's documentation stands alone: every `docs/<page>.md §N` citation in code, tests,
configs and docs resolves to a heading of that page, markdown links point at files that exist,
and nothing in the repository points outside it (a user who clones it must find what it cites)."""

from __future__ import annotations

import ast
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


# ---- the module map and what the pages cite --------------------------------------------------

PACKAGE = REPO / "arealite"
ARCHITECTURE = DOCS / "architecture.md"
EXAMPLE = REPO / "examples" / "gsm8k_grpo.py"
CODE = re.compile(r"`([^`\n]+)`")
# In architecture.md §2.2: a package's bold name (`**`rollout/`**`, `**top level**`) and the
# modules named after it, in order of appearance.
MAP_TOKEN = re.compile(r"\*\*`(?P<package>[\w/]+/)`\*\*|\*\*(?P<top>top level)\*\*|`(?P<module>[\w/]+\.py)`")
# A path into this repository: its first part is a top folder or a package of arealite.
TOP_FOLDERS = {"arealite", "tests", "examples", "configs", "benchmarks", "docs", ".ci"}
PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+/?$")
# A class-like name (`WeightSync`, `WeightSync.from_config`, `PPOActor(...)`), not an ALL_CAPS one.
CLASS_NAME = re.compile(r"^(?P<name>[A-Z]\w*[a-z]\w*)(?P<attrs>(?:\.\w+)*)(?:\(.*\))?$")
DOTTED = re.compile(r"^(?P<dotted>arealite(?:\.\w+)+)(?::(?P<attr>\w+))?(?:\(.*\))?$")
# Names the pages cite from other projects (vLLM, SGLang, peft, TRL, verl, openai, Slurm,
# tensorboard, torch, transformers), and JSON constants: checked nowhere here.
EXTERNAL_NAMES = {
    "AutoModelForSequenceClassification", "BadRequestError", "EventAccumulator", "GRPOTrainer",
    "Infinity", "MinPLogitsProcessor", "MixedPrecisionPolicy", "NaN", "NodeName", "NormConfig",
    "NotFoundError", "PeftModel", "PrefixStore", "ProcessGroupNCCL", "RolloutCorrectionConfig",
    "Sampler", "SlurmctldPort", "SlurmdPort", "SrunPortRange", "StatelessProcessGroup",
    "TopKTopPSampler", "ValueError", "W_s", "WeightTransferEngineFactory", "WorkerWrapperBase", "None", "True", "False",
}  # fmt: skip
# The changelog records names as they were when each entry was written.
HISTORY_PAGES = {"CHANGELOG"}


def section_text(page: Path, number: str) -> str:
    """The text under the heading numbered `number`, up to the next heading of its level or above."""
    lines, out, level = page.read_text().splitlines(), [], None
    for line in lines:
        m = re.match(r"^(#{1,6})\s+(\d+(?:\.\d+)*)[.\s]", line)
        heading = re.match(r"^(#{1,6})\s", line)
        if level is not None and heading and len(heading[1]) <= level:
            break
        if level is not None:
            out.append(line)
        elif m and m[2] == number:
            level = len(m[1])
    return "\n".join(out)


def map_modules(text: str) -> set[str]:
    """Module paths (`arealite/rollout/transport.py`) a module map names, each under the bold
    package name before it."""
    package, found = None, set()
    for m in MAP_TOKEN.finditer(text):
        if m["package"]:
            package = m["package"]
        elif m["top"]:
            package = ""
        elif package is not None:
            found.add(f"arealite/{package}{m['module']}")
    return found


def library_modules() -> set[str]:
    """Every module under arealite/ but the package `__init__` modules below the top one."""
    paths = {p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*.py")}
    return {p for p in paths if not (p.endswith("/__init__.py") and p != "arealite/__init__.py")}


def test_the_module_map_names_every_module_and_only_modules_that_exist():
    named = map_modules(section_text(ARCHITECTURE, "2.2"))
    missing, stale = sorted(library_modules() - named), sorted(named - library_modules())
    assert not missing, (
        "docs/architecture.md §2.2 does not name these modules (add each under its package's bold name, "
        f"`**`package/`**`): {missing}"
    )
    assert not stale, f"docs/architecture.md §2.2 names modules that do not exist: {stale}"


def test_the_map_parser_files_each_module_under_its_package():
    text = "**top level**: `types.py` (x). **`rollout/`**: `gate.py`, `kernels/gae.py` (`x`) **`chat/`**: `client.py`"
    assert map_modules(text) == {
        "arealite/types.py",
        "arealite/rollout/gate.py",
        "arealite/rollout/kernels/gae.py",
        "arealite/chat/client.py",
    }


def test_the_loop_section_quotes_calls_the_example_makes():
    """architecture.md §1 names the example's steps instead of copying them: every call it cites
    (`name(...)`) is in examples/gsm8k_grpo.py, so the page cannot describe a loop that is gone."""
    source = re.sub(r"\s+", " ", EXAMPLE.read_text())
    calls = [t for t in CODE.findall(section_text(ARCHITECTURE, "1")) if re.match(r"^[\w.]+\(.*\)$", t)]
    assert len(calls) >= 10, calls
    gone = [call for call in calls if (call if not call.endswith("(...)") else call[:-4]) not in source]
    assert not gone, f"docs/architecture.md §1 cites calls examples/gsm8k_grpo.py does not make: {gone}"


def _definitions() -> tuple[set[str], dict[str, tuple[set[str], list[str]]]]:
    """Every name defined in the repository's Python (classes, functions, assignments), and each
    class's members with its base names."""
    names: set[str] = set()
    classes: dict[str, tuple[set[str], list[str]]] = {}
    for path in repo_files():
        if path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if isinstance(node, ast.ClassDef):
                members = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                members |= {
                    n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                }
                members |= {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                old = classes.get(node.name, (set(), []))
                classes[node.name] = (old[0] | members, old[1] + bases)
    return names, classes


def _has_member(
    classes: dict[str, tuple[set[str], list[str]]], cls: str, member: str, seen: frozenset = frozenset()
) -> bool:
    if cls not in classes or cls in seen:
        return cls not in classes  # a base from another library: not checked
    members, bases = classes[cls]
    return member in members or any(_has_member(classes, b, member, seen | {cls}) for b in bases if b in classes)


def _module_defines(dotted: str, attr: str | None) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:k])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if module.exists():
            rest = parts[k:] + ([attr] if attr else [])
            break
    else:
        return False
    if not rest:
        return True
    if len(rest) > 1:
        return False
    source = module.read_text()
    return (
        re.search(rf"\b(def|class)\s+{rest[0]}\b|\b{rest[0]}\b\s*[:=]|import[^\n]*\b{rest[0]}\b|\"{rest[0]}\"", source)
        is not None
    )


def test_every_path_and_name_the_docs_cite_exists():
    """What a page under docs/ cites in backticks is there: each path into the repository, each
    class-like name (and its attribute, on a class of ours), each `arealite.module[.name]`."""
    names, classes = _definitions()
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    bad = []
    for page in sorted(p for stem, p in PAGES.items() if stem not in HISTORY_PAGES):
        for lineno, line in enumerate(page.read_text().splitlines(), 1):
            for token in CODE.findall(line):
                where = f"docs/{page.name}:{lineno}: `{token}`"
                if PATH.match(token) and token.split("/")[0] in TOP_FOLDERS | packages:
                    if not any((root / token).exists() for root in (REPO, PACKAGE, DOCS)):
                        bad.append(f"{where}: no such file or folder")
                elif m := DOTTED.match(token):
                    if not _module_defines(m["dotted"], m["attr"]):
                        bad.append(f"{where}: no such module or name in arealite")
                elif (m := CLASS_NAME.match(token)) and m["name"] not in EXTERNAL_NAMES:
                    attrs = m["attrs"].lstrip(".").split(".") if m["attrs"] else []
                    if m["name"] not in names:
                        bad.append(f"{where}: {m['name']} is defined nowhere in the repository")
                    elif attrs and not _has_member(classes, m["name"], attrs[0]):
                        bad.append(f"{where}: {m['name']} has no member {attrs[0]}")
    assert not bad, "\n".join(bad)


def test_the_citation_checks_catch_a_made_up_path_and_name():
    names, classes = _definitions()
    assert "WeightSync" in names and "NoSuchEngine" not in names
    assert _has_member(classes, "WeightSync", "from_config") and not _has_member(classes, "WeightSync", "no_such")
    assert _module_defines("arealite.rollout.transport", "Transport")
    assert not _module_defines("arealite.rollout.transport", "NoSuchThing")
    assert not _module_defines("arealite.no_such_module", None)
    assert PATH.match("arealite/rollout/transport.py") and not PATH.match("transport.py")

"""Figures live in one place: benchmarks/README.md (current) and benchmarks/LOG.md (history).

Two rules keep them there. No commit hash appears in the docs, the READMEs, code comments,
docstrings or help texts; benchmarks/README.md may name one only in a table's `commit` column,
and benchmarks/LOG.md is the log. No measured timing appears in code comments, docstrings,
`--help` or config help: the comment keeps its why, the microseconds of one machine go to the
log (git keeps the history). Settings such as a timeout's default are not measurements, so the
timing rule looks for what measurements are written as: sub-second units, throughputs,
"N x faster", and seconds next to a word that says something was timed."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.test_docs import REPO, repo_files

# One worker parses the repository once for all the tests here (a few CPU seconds).
pytestmark = pytest.mark.xdist_group("figures_in_one_place")

LOG = REPO / "benchmarks" / "LOG.md"
FIGURES = REPO / "benchmarks" / "README.md"

# A commit hash as people paste it: 7-40 hex digits with at least one digit and one letter, not
# part of a longer word or number (so neither `deadbeef`-like words nor `1.4e-06` match).
HASH = re.compile(r"(?<![\w.\-/])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w\-])")

_NUM = r"\d+(?:[.,]\d+)?(?:\s?(?:-|to)\s?\d+(?:[.,]\d+)?)?k?"
# Measured, whatever the words around: sub-second durations, throughputs, speed-ups.
_ALWAYS = (
    rf"{_NUM}\s?(?:ns|us|µs|ms)\b"
    rf"|{_NUM}\s?(?:tok|tokens|it|req|requests|GB|MB)/s\b"
    rf"|{_NUM}\s?x\s(?:faster|slower|as long|cheaper)"
)
# Seconds and minutes count as measured only beside a word that says so (a setting's default
# such as "5 s" does not).
_TIMED = r"(?:took|takes|measured|faster|slower|cost|costs|costing|spent|per call|per step|a step|per request|wall)"
_SECONDS = rf"{_NUM}\s?(?:s|seconds?|min|minutes?)\b"
# An estimate of a duration ("about 15 s", "~3 s") or an accuracy reached in a time ("0.911 in
# 145 s") is a measurement too.
_ESTIMATE = rf"(?:about|around|~)\s?{_SECONDS}|\d\.\d+ in {_SECONDS}"
TIMING = re.compile(rf"{_ALWAYS}|{_ESTIMATE}|{_TIMED}[^.;]{{0,40}}?{_SECONDS}|{_SECONDS}[^.;]{{0,25}}?{_TIMED}", re.I)

HELP_KEYWORDS = {"help", "description", "epilog"}


def _constant_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def python_prose(source: str) -> list[tuple[int, str, str]]:
    """(line, kind, text) for every comment, docstring and help text of a Python source: the
    prose a reader takes for documentation. Help texts are `help=`/`description=`/`epilog=`
    keywords (argparse) and the second argument of the config's `setting(default, help)`."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            found.append((tok.start[0], "comment", tok.string))
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and (text := _constant_text(doc.value)) is not None:
                found.append((doc.lineno, "docstring", text))
        elif isinstance(node, ast.Call):
            texts = [k.value for k in node.keywords if k.arg in HELP_KEYWORDS]
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "setting" and len(node.args) >= 2:
                texts.append(node.args[1])
            found += [(t.lineno, "help", s) for t in texts if (s := _constant_text(t)) is not None]
    return found


def yaml_prose(source: str) -> list[tuple[int, str, str]]:
    return [(n, "comment", line[line.index("#") :]) for n, line in enumerate(source.splitlines(), 1) if "#" in line]


@functools.cache
def prose(path: Path) -> list[tuple[int, str, str]]:
    text = path.read_text(errors="replace")
    # Most files quote nothing: skip parsing them. Adjacent string literals are joined first, as
    # the parser joins them, so a help text split over two lines is still seen.
    joined = re.sub(r"[\"']\s*\n\s*[rbf]?[\"']", "", text)
    if not (TIMING.search(joined) or HASH.search(joined)):
        return []
    if path.suffix == ".py":
        return python_prose(text)
    if path.suffix in {".yaml", ".yml", ".toml"} or path.name == "run":
        return yaml_prose(text)
    return []


def stray_hashes(text: str, commit_column_allowed: bool) -> list[tuple[int, str]]:
    """(line, hash) for every hash of a markdown text, except, where allowed, those in the
    `commit` column of a table (the current figures' rows)."""
    found, commit_col = [], None
    for lineno, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None:
            commit_col = None
        elif "commit" in cells:
            commit_col = cells.index("commit")
        for m in HASH.finditer(line):
            in_commit_column = cells is not None and commit_col is not None and commit_col < len(cells)
            if commit_column_allowed and in_commit_column and m[0] in cells[commit_col]:
                continue
            found.append((lineno, m[0]))
    return found


def _ours(path: Path) -> bool:
    return path != Path(__file__).resolve()


def _timings(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{n} ({kind}): {m[0]!r}"
        for n, kind, text in prose(path)
        for m in TIMING.finditer(text)
    ]


def test_no_commit_hash_outside_the_log():
    bad = []
    for path in filter(_ours, repo_files()):
        rel = path.relative_to(REPO)
        if path == LOG:
            continue
        if path.suffix in {".md", ".txt"}:
            bad += [f"{rel}:{n}: {h}" for n, h in stray_hashes(path.read_text(errors="replace"), path == FIGURES)]
        else:
            bad += [f"{rel}:{n} ({kind}): {h}" for n, kind, text in prose(path) for h in HASH.findall(text)]
    assert not bad, "commit hashes belong in benchmarks/LOG.md (git keeps the rest):\n" + "\n".join(bad)


def test_no_measured_timing_in_comments_docstrings_or_help():
    bad = [line for path in filter(_ours, repo_files()) for line in _timings(path)]
    assert not bad, (
        "measured timings belong in benchmarks/README.md or LOG.md; keep the why, drop the number:\n" + "\n".join(bad)
    )


def test_the_rules_catch_planted_figures(tmp_path):
    # The guard itself: each planted figure is found, each setting and non-hash is let through.
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""Fast: 109 -> 70 us a call here, at 1917c48."""\n'
        "import argparse\n"
        "x = 1  # the lean forward is 1.65-2.5x faster per decode step\n"
        "y = 2  # a sync took 0.32 s after the signal\n"
        "z = 3  # waits 5 s by default; 1.4e-06 is not a hash, nor is deadbeef\n"
        "w = 4  # 300 steps leave about 15 s\n"
        'argparse.ArgumentParser().add_argument("--n", help="server 27.8k tok/s")\n'
        'c = setting(3, "the step took 2.5 seconds (benchmarks/README.md)")\n'
        'd = setting(4, "a forward took "\n    "0.5 ms")\n'
    )
    texts = prose(planted)
    timings = sorted(m[0] for _, _, t in texts for m in TIMING.finditer(t))
    expected = ["0.5 ms", "1.65-2.5x faster", "27.8k tok/s", "70 us", "about 15 s", "took 0.32 s", "took 2.5 seconds"]
    assert timings == expected, timings
    assert [h for _, _, t in texts for h in HASH.findall(t)] == ["1917c48"]

    table = "see 2c531f9\n\n| script | commit |\n|---|---|\n| a | 02dcf3c |\n| 93a5233 | - |\n\n| x |\n| 5af73ad |\n"
    assert [h for _, h in stray_hashes(table, commit_column_allowed=False)] == [
        "2c531f9",
        "02dcf3c",
        "93a5233",
        "5af73ad",
    ]
    assert [h for _, h in stray_hashes(table, commit_column_allowed=True)] == ["2c531f9", "93a5233", "5af73ad"]

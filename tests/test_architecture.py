"""The module layout's rules, read from the source (AST only; docs/architecture.md §2.3).

The import graph counts every import of an arealite module: at module level, under
`if TYPE_CHECKING:` and inside functions (a cycle hidden behind TYPE_CHECKING or a deferred
import is still two modules that know each other). Importing `a.b.c` also runs `a.b`'s
`__init__`, so that edge is added too, except from a module inside `a.b` itself (Python has
already run that `__init__` when it gets there).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "arealite"

# Cycles that remain, each as the sorted set of its modules. The test fails if this list is
# larger or smaller than the truth, so it cannot go stale. None remains.
ALLOWED_CYCLES: set[frozenset[str]] = set()
MAX_MODULE_DOCSTRING_LINES = 20


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The arealite modules `name` imports anywhere in its source."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import mod` imports pkg.mod when that is a module, else a name of pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    for name, targets in graph.items():
        for target in list(targets):
            parent = target.rpartition(".")[0]
            while parent in modules and not (name == parent or name.startswith(parent + ".")):
                targets.add(parent)
                parent = parent.rpartition(".")[0]
    return graph


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], set()
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.add(frozenset(component))
    return out


def test_cycle_finder_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == {frozenset({"a", "b", "c"})}


def test_no_import_cycle_in_arealite():
    assert _cycles(_graph()) == ALLOWED_CYCLES


@pytest.mark.parametrize(
    "source, forbidden",
    [
        ("arealite.weight_sync", ("arealite.rollout", "arealite.train")),  # through the interfaces only
        ("arealite.rollout", ("arealite.train",)),
        ("arealite.workflow", ("arealite.train",)),
        ("arealite.train", ("arealite.rollout",)),
        ("arealite.interfaces", ("arealite.rollout", "arealite.train", "arealite.workflow")),
        # the backend seam: the client and the launchers stand on it, never the reverse
        ("arealite.backends", ("arealite.rollout", "arealite.launcher", "arealite.train", "arealite.workflow")),
    ],
)
def test_dependencies_point_one_way(source, forbidden):
    wrong = [
        (name, target)
        for name, targets in _graph().items()
        if name == source or name.startswith(source + ".")
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    ]
    assert wrong == []


def test_rollout_parts_do_not_know_the_client():
    """Inside rollout/, only the package's __init__ imports the client that assembles the parts (and the
    old module paths kept as import shims for one release)."""
    importers = sorted(
        name
        for name, targets in _graph().items()
        if name.startswith("arealite.rollout") and "arealite.rollout.client" in targets
    )
    assert importers == ["arealite.rollout", "arealite.rollout.remote_sglang", "arealite.rollout.remote_vllm"]


def _arealite_modules_imported_by(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "arealite":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "arealite"}
    return found


def test_the_main_example_imports_from_at_most_four_arealite_modules():
    modules = _arealite_modules_imported_by(REPO / "examples" / "gsm8k_grpo.py")
    assert modules and len(modules) <= 4, sorted(modules)


def test_every_public_name_resolves_and_type_checkers_see_the_same_names():
    import arealite

    assert arealite.__all__ == sorted(set(arealite.__all__))
    for name in arealite.__all__:
        assert getattr(arealite, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        arealite.NoSuchThing  # noqa: B018
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert checked == set(arealite.__all__)


@pytest.mark.parametrize("module", ["arealite", "arealite.launcher.local"])
def test_importing_stays_light(module):
    """`import arealite` loads its names lazily; a launcher never loads model code."""
    code = f"import sys, {module}; print(sorted(m for m in ('torch', 'transformers', 'aiohttp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_module_docstrings_state_a_contract_in_a_few_lines():
    """A module's docstring says what it is and promises; the long explanations live in docs/."""
    long = {}
    for name, path in _modules().items():
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
        if doc and doc.count("\n") + 1 >= MAX_MODULE_DOCSTRING_LINES:
            long[name] = doc.count("\n") + 1
    assert not long, f"module docstrings of {MAX_MODULE_DOCSTRING_LINES}+ lines (move detail to docs/): {long}"


MAX_MODULE_LINES = 400
# Modules allowed over the limit (none: every module is held to it; a module named here while it
# is under the limit fails the test too, so the list cannot go stale).
OVER_LIMIT_BEING_SPLIT: set[str] = set()


def test_no_library_module_is_over_400_lines():
    """A module a reader can hold in mind: none over MAX_MODULE_LINES lines, save the allow-list's,
    and the allow-list names only modules still over the limit (so it cannot outlive its reason)."""
    lines = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    over = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert not over.keys() - OVER_LIMIT_BEING_SPLIT, f"modules over {MAX_MODULE_LINES} lines (split them): " + str(
        {name: over[name] for name in sorted(over.keys() - OVER_LIMIT_BEING_SPLIT)}
    )
    done = sorted(OVER_LIMIT_BEING_SPLIT - over.keys())
    assert not done, f"now at most {MAX_MODULE_LINES} lines: remove from OVER_LIMIT_BEING_SPLIT: {done}"


@pytest.mark.parametrize(
    "source, allowed",
    [
        ("arealite.algo", ()),  # the mathematics: torch and triton only
        ("arealite.server", ("arealite.algo", "arealite.utils", "arealite.weight_sync")),  # no client, no trainer
    ],
)
def test_the_leaves_import_little_of_arealite(source, allowed):
    outside = sorted(
        {
            target
            for name, targets in _graph().items()
            if name == source or name.startswith(source + ".")
            for target in targets
            if not (target == source or target.startswith(source + "."))
            and not any(target == a or target.startswith(a + ".") for a in allowed)
        }
    )
    assert outside == [], f"{source} imports {outside} (docs/architecture.md §2.3)"

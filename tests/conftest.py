"""Shared fixtures, the `cuda` marker, and the groups of tests that must not run side by side.

Without CUDA the Triton kernels run in triton's interpreter (TRITON_INTERPRET=1, set before
any kernel module is imported); with CUDA they are compiled and tested on CUDA tensors.
Tests marked `@pytest.mark.cuda` (the GPU self-check, `python -m pytest -m cuda -q`) are
skipped with a reason where CUDA is absent.

The README's command runs the suite on three pytest-xdist workers (`-n 3 --dist loadgroup`).
Tests that start a cluster (Ray, Slurm's one node, the namespaced hosts on their fixed
private subnet) share one machine-wide resource, so they join one xdist group and run one
after another on one worker, which mostly waits on those processes; the other two workers
keep a 2-core machine's cores busy.

Tests that share a costly fixture wider than one test (a module's server, a package's session
server, the trained tool-calling model) also run on one worker, so it is built once: spread
over the workers, each would build its own, and a worker that runs another module's test in
between tears a module's fixture down and builds it again.
"""

import os
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tests.e2e.shared_runs import dumped_run  # noqa: E402,F401  (session fixture)
from tests.smollm2_model import smollm2_dir  # noqa: E402,F401  (session fixture)
from tests.tool_model import tool_engine, tool_model_dir, tool_tokenizer  # noqa: E402,F401  (session fixtures)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("AREALITE_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny random Qwen2 model + tokenizer, built once per test session."""
    from arealite.tools.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), seed=0)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"shared data folder {SHARED_DATA} is missing; set AREALITE_SHARED_DATA")
    return SHARED_DATA


VLLM_TESTS = "tests/vllm/"  # one vLLM server for the session (tests/vllm/conftest.py): one worker owns it
CLUSTER_TESTS = ("tests/launcher/test_ray.py", "tests/launcher/test_slurm.py", "tests/multinode/")


def _starts_a_cluster(item: pytest.Item) -> bool:
    path = Path(str(item.fspath)).relative_to(REPO_ROOT).as_posix()
    params = getattr(item, "callspec", None)
    kind = params.params.get("kind") if params is not None else None
    return path.startswith(CLUSTER_TESTS) or kind in ("ray", "slurm")


# Session fixtures that are cheap to build, or that nearly every test uses: sharing one of these
# does not bind tests to one worker (it would put most of the suite in one group).
CHEAP_SHARED = {"tiny_model_dir", "shared_data", "model_dir", "tokenizer", "tool_tokenizer"}


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures wider than one test that `item` uses (builtin ones and CHEAP_SHARED aside)."""
    out = []
    for name in getattr(item, "fixturenames", ()):
        defs = item._fixtureinfo.name2fixturedefs.get(name)
        if not defs or defs[-1].scope == "function" or not defs[-1].baseid or name in CHEAP_SHARED:
            continue
        # a module- or class-scoped fixture has one instance per module, wherever it is defined
        where = item.nodeid.split("::")[0] if defs[-1].scope in ("module", "class") else defs[-1].baseid
        out.append(f"{where}::{name}")
    return out


def _sharing_groups(items: Iterable[pytest.Item]) -> dict[pytest.Item, str]:
    """Each item that shares a costly fixture with another, mapped to one name per connected set."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    uses = {item: _shared_fixtures(item) for item in items}
    for keys in uses.values():
        for key in keys[1:]:
            parent[root(key)] = root(keys[0])
    counts: dict[str, int] = {}
    for keys in uses.values():
        if keys:
            counts[root(keys[0])] = counts.get(root(keys[0]), 0) + 1
    return {item: root(keys[0]) for item, keys in uses.items() if keys and counts[root(keys[0])] > 1}


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, which reads xdist_group to schedule the group
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (the GPU self-check: python -m pytest -m cuda -q)")
    sharing = _sharing_groups(items)
    for item in items:
        if _starts_a_cluster(item):
            item.add_marker(pytest.mark.xdist_group("clusters"))
        elif Path(str(item.fspath)).relative_to(REPO_ROOT).as_posix().startswith(VLLM_TESTS):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        elif item in sharing:
            item.add_marker(pytest.mark.xdist_group(sharing[item]))
        if not HAS_CUDA and "cuda" in item.keywords:
            item.add_marker(skip)

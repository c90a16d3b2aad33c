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
"""

import os
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

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


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, which reads xdist_group to schedule the group
def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (the GPU self-check: python -m pytest -m cuda -q)")
    for item in items:
        if _starts_a_cluster(item):
            item.add_marker(pytest.mark.xdist_group("clusters"))
        elif Path(str(item.fspath)).relative_to(REPO_ROOT).as_posix().startswith(VLLM_TESTS):
            item.add_marker(pytest.mark.xdist_group("vllm"))
        if not HAS_CUDA and "cuda" in item.keywords:
            item.add_marker(skip)

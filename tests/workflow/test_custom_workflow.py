"""The README's custom-workflow example, taken from the docs verbatim, runs end to end."""

import re
from pathlib import Path

import pytest

from arealite.config import GenerationHyperparameters

pytestmark = pytest.mark.timeout(180)
REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Writing your own rollout workflow"


def example_code() -> str:
    """The first python block of the section in README.md."""
    for path in (REPO_ROOT / "README.md",):
        text = path.read_text() if path.exists() else ""
        if SECTION in text:
            section = text.split(SECTION, 1)[1]
            return re.search(r"```python\n(.*?)```", section, re.S).group(1)
    pytest.fail(f"no {SECTION!r} section in README.md")


def test_readme_workflow_runs(server_engine, tokenizer):
    namespace: dict = {}
    exec(compile(example_code(), "README example", "exec"), namespace)
    workflow = namespace["ConciseWorkflow"](GenerationHyperparameters(max_new_tokens=5), tokenizer)
    records = [{"id": str(i), "messages": [{"role": "user", "content": f"Say {i}."}]} for i in range(3)]
    batch = server_engine.rollout_batch(records, workflow)
    assert batch["input_ids"].shape[0] == 6 and batch["rewards"].shape == (6,)
    stopped = batch["rewards"].bool()
    lengths = batch["loss_mask"].sum(1)
    assert (lengths[~stopped] == 5).all()  # unrewarded samples ran out of budget
    assert (batch["versions"][batch["loss_mask"].bool()] == server_engine.get_version()).all()

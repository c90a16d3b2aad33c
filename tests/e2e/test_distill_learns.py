"""On-policy distillation moves the student toward its teacher, end to end through the example
script: the student samples, a teacher server scores every sampled token, the reverse-KL
advantage trains the student, the weights sync, and the student's next samples agree more with
the teacher (its per-token reverse KL `kl_teacher`, which the step stats report, falls).

The student is the tiny random model; the teacher is the same model after a short supervised
warm start on the main job's sums (`arealite.tools.sft_warmstart`): the same tokenizer, and a
peaked preference for the answer format that the student, sampling nearly uniformly, can learn
in a few steps. The verifiable reward plays no part (`distill.reward_weight` 0). Negating the
distillation advantage (arealite/algo/distill.py) leaves `kl_teacher` where it started or higher.
Robust by construction: seeded sampling and data, and a margin (the last steps' mean below 0.8x
the first steps') far from what the run reaches.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from arealite.server.process import launch_server_process
from tests.e2e.example_run import REPO, run_example

pytestmark = pytest.mark.timeout(900)
STEPS = 14
SFT_STEPS = 40


def test_distillation_lowers_the_students_reverse_kl_to_the_teacher(tmp_path, tiny_model_dir):
    teacher_dir = str(tmp_path / "teacher")
    warm = [sys.executable, "-m", "arealite.tools.sft_warmstart", "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
            f"sft.base_path={tiny_model_dir}", f"actor.path={teacher_dir}", f"sft.steps={SFT_STEPS}"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(warm, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
    teacher = launch_server_process(teacher_dir, extra_args=["--skip-server-warmup"], timeout=300)
    try:
        rows = run_example(tmp_path, tiny_model_dir, "distill", [
            f"distill.address={teacher.address}", "distill.kl_coef=1.0", f"total_train_steps={STEPS}",
            "train_dataset.batch_size=16", "gconfig.group_size=4", "gconfig.max_new_tokens=8",
            "rollout.dynamic_sampling=false", "actor.ppo_n_minibatches=1", "actor.optimizer.lr=0.01",
            "actor.optimizer.lr_scheduler_type=constant",
        ], timeout=600)  # fmt: skip
    finally:
        teacher.stop()
    kl = [row["kl_teacher"] for row in rows if "kl_teacher" in row]
    assert len(kl) == STEPS, rows[-1]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    print(f"kl_teacher per step: {[round(k, 3) for k in kl]}")
    assert last < 0.8 * first, f"the student did not move toward the teacher: kl_teacher {first:.3f} -> {last:.3f}"

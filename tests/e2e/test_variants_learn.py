"""Every variant of the RL lab's matrix (configs/variants.yaml) learns, end to end.

Each variant is the example script with the matrix's own base config and overrides for that
variant, run on a random tiny model for a few steps with the even-token-fraction reward
(tests/e2e/varied_reward.py: every group has reward variance from the first step). The mean
batch reward must rise by a clear margin; a flipped gradient sign in the path the variant
uses (its advantage estimator, its loss, its ratio, its adapter) pushes the reward down
instead. GRPO itself is guarded by tests/e2e/test_learning.py.

No timing is asserted; sampling is seeded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.example_run import run_example

REPO = Path(__file__).resolve().parents[2]
MATRIX = yaml.safe_load((REPO / "configs" / "variants.yaml").read_text())["variants"]
STEPS = 10
WINDOW = 3  # steps averaged at each end
MARGIN = 0.15  # required rise of the mean batch reward (a working loop gains ~0.3 in 10 steps)
COMMON = [
    f"total_train_steps={STEPS}", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
    "gconfig.sampling_seed=5", "gconfig.max_new_tokens=8", "gconfig.group_size=8",
    "train_dataset.batch_size=8", "train_dataset.num_samples=256", "actor.ppo_n_minibatches=1",
    "actor.optimizer.lr=0.01", "actor.optimizer.lr_scheduler_type=constant", "rollout.dynamic_sampling=false",
    "launcher.setup_commands=[]",
]  # fmt: skip
# What a random model on this task needs beyond the matrix's settings (found by these runs):
TEST_ONLY = {
    # The matrix's adapter includes lm_head: a random model's output layer has rows of norm ~0.16
    # against a normed hidden state, so its logits stay within about +-1.3 whatever the layers
    # below do. A random model needs the larger step.
    "lora": ["actor.optimizer.lr=0.03"],
    "ppo": ["critic.optimizer.lr=0.01"],
    "dapo": ["actor.overlong_tokens=4"],  # the matrix's budget is 4 tokens, this test's 8
}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
# Kept out of the default command (heavy) to pay for the off-policy loss guards
# (tests/train/test_offpolicy_variants_learn.py): gspo's run here is on-policy with one
# minibatch, so its ratio is exactly 1 and its own math never acts (the off-policy guard runs
# it); dr_grpo, reinforce_pp_baseline and rloo change only the advantage estimate, whose every
# group_norm x whiten combination is checked through the config against a naive loop in
# tests/train/test_actor.py.
# The matrix's objectives and corrections (cispo ... icepop) are guarded off-policy there too.
HEAVY = {
    "gspo",
    "dr_grpo",
    "reinforce_pp_baseline",
    "rloo",
    "lora",  # the synced adapter's served logprobs: tests/train/test_lora_sync.py
    "dapo",  # overlong penalty, clip-higher, dynamic sampling: tests/algo, tests/train, e2e/test_dynamic_sampling.py
    "cispo",
    "sapo",
    "dppo_tv",
    "tis_token",
    "geo_mask",
    "icepop",
}


def server_args(overrides: list[str]) -> tuple[str, ...]:
    """What the launcher would add to the server's command line for these overrides (LoRA)."""
    if "weight_update=lora" not in overrides:
        return ()
    return ("--enable-lora", "--max-lora-rank", "8")


@pytest.mark.parametrize(
    "variant", [pytest.param(v, marks=pytest.mark.heavy) if v in HEAVY else v for v in sorted(MATRIX) if v != "grpo"]
)
def test_variant_raises_the_reward_of_a_random_model(variant: str, tmp_path, tiny_model_dir) -> None:
    spec = MATRIX[variant]
    # the matrix's own schedule (a variant may need more steps there) never reaches this short test
    matrix_overrides = [o for o in spec.get("overrides", []) if not o.startswith("total_train_steps=")]
    overrides = [*COMMON, *matrix_overrides, *TEST_ONLY.get(variant, [])]
    rows = run_example(
        tmp_path, tiny_model_dir, variant, overrides, config=Path(spec["base"]).name, server_args=server_args(overrides)
    )
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"{variant}: mean batch reward, first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"{variant} did not learn: reward {first:.3f} -> {last:.3f} ({rewards})"

"""RL learns, end to end: the example script, run on a random tiny model against a built-in
server, raises its reward by a clear margin within a few dozen steps.

The task is the even-token fraction of each completion (tests/e2e/varied_reward.py): every
group has reward variance from the first step, so GRPO gets a signal at once, and the only
way to raise the reward is the whole loop working — the sampled tokens reaching the trainer
in their rows, advantages of the right sign, the update, and the weight sync that puts the
new policy on the server. A sign flip in the advantages or the loss, or a weight sync that
never lands, leaves the reward flat or pushes it down. Not covered here: the server's
logprobs. This run is on-policy with one minibatch, so the loss takes its old logprobs from
the trainer's own forward and the server's never enter it; their alignment with the
trainer's is tested by tests/train/test_server_parity.py (max |diff| bounded).

Robust by construction: seeded sampling, a margin (0.15) far below the gain a working loop
reaches on this task, and no timing assertion.
"""

from __future__ import annotations

import pytest

from tests.e2e.example_run import run_example

STEPS = 16
WINDOW = 4  # steps averaged at each end (one step's batch reward is noisy)
MARGIN = 0.15  # required rise of the mean batch reward
pytestmark = pytest.mark.timeout(300)


def test_grpo_raises_the_reward_of_a_random_model(tmp_path, tiny_model_dir):
    rows = run_example(tmp_path, tiny_model_dir, "learn", [
        f"total_train_steps={STEPS}", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
        "gconfig.sampling_seed=5", "gconfig.max_new_tokens=8", "gconfig.group_size=8",
        "train_dataset.batch_size=8", "train_dataset.num_samples=256", "actor.ppo_n_minibatches=1",
        "actor.optimizer.lr=0.01", "actor.optimizer.lr_scheduler_type=constant",
        "rollout.max_head_offpolicyness=0", "rollout.dynamic_sampling=false",
    ])  # fmt: skip
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"mean batch reward: first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"RL did not learn: reward {first:.3f} -> {last:.3f} over {STEPS} steps ({rewards})"

"""An unmodified `openai`-package program learns through the endpoint: examples/openai_agent_grpo.py
through the local launcher, every sample a run of examples/openai_agent.py in a subprocess, on a
random tiny model scored by the even-token fraction of the program's final reply
(tests/e2e/varied_reward.py: reward variance in every group from the first step).

Checked: the mean batch reward of the last 3 of 12 steps exceeds that of the first 3 by 0.15
(8 programs a step; a policy gradient of the wrong sign pushes it down instead), every sample
was a program run, no program timed out, one weight version per step, and the example exits 0
with its accuracy line. The logprobs the program received being the trained ones is checked
by tests/agent/, not here. Sampling is seeded; no timing is asserted (the timeout bounds a
hung run on a loaded machine). tests/examples/test_openai_agent_example.py (heavy) runs the
example on the tool-calling model.
"""

import pytest

from tests.examples.agent_example_run import run_agent_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STEPS = 12
WINDOW = 3  # steps averaged at each end
MARGIN = 0.15  # required rise of the mean batch reward (docs/agents.md gives the measured rise)


def test_openai_agent_program_raises_its_reward(tmp_path, tiny_model_dir):
    overrides = [
        f"fileroot={tmp_path}", f"actor.path={tiny_model_dir}", "launcher.setup_commands=[]",
        f"total_train_steps={STEPS}", "reward_fn=tests.e2e.varied_reward:even_token_fraction",
        "train_dataset.num_samples=256", "train_dataset.batch_size=2", "gconfig.group_size=4",
        "gconfig.max_new_tokens=8", "gconfig.sampling_seed=5", "actor.optimizer.lr=0.04",
        "actor.optimizer.lr_scheduler_type=constant", "actor.optimizer.warmup_steps_proportion=0",
        "evaluator.num_samples=4", "stats_logger.plot=false",
    ]  # fmt: skip
    _, rows = run_agent_example(overrides, timeout=560)
    rewards = [r["reward"] for r in rows if "reward" in r]
    assert len(rewards) == STEPS and rows[-1]["agent/agent_timeouts"] == 0
    assert [r["step"] for r in rows] == list(range(STEPS)) and all(r["version"] == r["step"] + 1 for r in rows)
    assert rows[-1]["agent/samples"] >= STEPS * 2 * 4  # every sample was a program run
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    print(f"openai agent: mean batch reward, first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"the agent did not learn: reward {first:.3f} -> {last:.3f} ({rewards})"

"""Per-turn credit learns through vLLM: `actor.adv_estimator=turn_loo` with `server.backend=vllm`,
set in an experiment config as a user sets them, on the package's vLLM server (tests/vllm/conftest.py).

The objects are the training script's (examples/gsm8k_grpo.py), built from that config:
`rollout_client` (server.backend's protocol), `PPOActor` (which reads actor.adv_estimator) and
`WeightSync` (weight_update=disk: each step's weights reach the server before the next
rollout). Episodes are `MultiTurnWorkflow` conversations of up to 3 answers of 4 tokens; an
answer's reward is (its even token ids - 2) / 4, and a turn scoring <= 0 gets feedback and
another turn, so the policy decides how many turns it takes and every turn has a reward of its
own. The episode's return (the sum of its turn rewards) rises only if each turn's credit reaches
its tokens with the right sign: a flipped per-turn advantage pushes it down (more odd tokens,
more turns that each cost).

Seeded sampling (the config's `seed`), no timing asserted.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from arealite import GRPOConfig, PPOActor, WeightSync, load_config, rollout_client
from arealite.workflow import MultiTurnWorkflow

pytestmark = pytest.mark.timeout(600)
PROMPTS, STEPS, WINDOW = 8, 6, 3
# required rise of the mean episode return (in -1.5 .. 0.5), first WINDOW steps to last WINDOW steps:
# about half the smallest rise measured over seeds 1-5; with the per-turn advantage's sign flipped
# (`base - ret` in arealite/algo/turns.py) the return fell by several times the margin instead
MARGIN = 0.12


class EvenTokens:
    """An answer's reward: (even token ids - 2) / 4, in process (`ascore`: no reward workers)."""

    async def ascore(self, prompt, completion, prompt_ids, completion_ids, **data) -> float:
        return (sum(t % 2 == 0 for t in completion_ids) - 2) / 4


def test_per_turn_credit_raises_the_return_through_vllm(vllm_server, tmp_path) -> None:
    config = load_config(
        [
            f"actor.path={vllm_server.model_dir}", "actor.adv_estimator=turn_loo", "server.backend=vllm",
            "weight_update=disk", f"fileroot={tmp_path}", f"total_train_steps={STEPS}", "seed=3",
            "actor.dtype=float32", "actor.optimizer.lr=0.01", "gconfig.group_size=8", "gconfig.max_new_tokens=4",
        ],
        GRPOConfig,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(config.actor.path)
    workflow = MultiTurnWorkflow(EvenTokens(), config.gconfig, tokenizer, max_turns=3, turn_discount=1.0)
    returns, turns = [], []
    try:
        with (
            rollout_client(config, [vllm_server.address]) as rollout,
            PPOActor(config.actor, config.gconfig, STEPS) as actor,
            WeightSync.from_config(config, actor, rollout) as weight_sync,
        ):
            for step in range(STEPS):
                records = [{"id": f"{step}-{i}", "prompt": f"Round {step}, task {i}."} for i in range(PROMPTS)]
                batch = rollout.rollout_batch(records, workflow)
                assert batch["versions"][batch["loss_mask"].bool()].eq(step).all()  # made by the weights of `step`
                actor.compute_advantages(batch)
                actor.ppo_update(batch)
                weight_sync.sync(step + 1)
                returns.append(float(batch["turn_rewards"].sum(1).mean()))
                turns.append(float(batch["num_turns"].float().mean()))
    finally:
        vllm_server.restore()
    first, last = sum(returns[:WINDOW]) / WINDOW, sum(returns[-WINDOW:]) / WINDOW
    print(f"turn_loo through vLLM: mean episode return {first:.3f} -> {last:.3f}; returns {returns}; turns {turns}")
    assert last >= first + MARGIN, f"per-turn credit did not learn through vLLM: {first:.3f} -> {last:.3f} ({returns})"

"""Per-turn credit learns (`actor.adv_estimator=turn_loo`), on a task whose turns have their own
rewards and where the policy decides how many turns it takes.

Each episode is up to 3 turns of 4 tokens from a random tiny model, with an environment token
between turns. A turn's reward is the fraction of even token ids in it (a sub-goal per turn);
the episode goes on to another turn only when the turn ended on an even token. The episode's
return (the sum of its turn rewards) rises only if the turns' credit reaches their tokens with
the right sign: a flipped per-turn advantage pushes it down. The batch is built as the
multi-turn workflows build theirs (`trajectory_from_tokens` with `output_turn_ids` and
`turn_rewards`), 8 prompts x 8 episodes a step.

In process (the PPOActor and a transformers copy as the sampler, no server), a few seconds.
Sampling is seeded; no timing is asserted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.rollout.batch import trajectory_from_tokens
from arealite.train.actor import PPOActor

torch.set_num_threads(2)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PROMPTS, GROUP, PROMPT_LEN, NEW, TURNS = 8, 8, 4, 4, 3
STEPS, WINDOW, MARGIN = 10, 3, 0.3
ENV_TOKEN = 1  # what the environment says between two turns (loss mask 0)


def rollout_episodes(model, prompts: torch.Tensor, g: torch.Generator, parity: int = 0) -> dict:
    """Roll out every episode turn by turn; the batch as a multi-turn workflow returns it. An episode
    goes on after a turn whose last token id has this parity (benchmarks/turn_credit.py: odd)."""
    B = prompts.shape[0]
    ids = prompts
    outputs, logps, turn_ids = [[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)]
    rewards: list[dict[int, float]] = [{} for _ in range(B)]
    alive = [True] * B
    with torch.no_grad():
        for turn in range(TURNS):
            step_ids = []
            for _ in range(NEW):
                lp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)
                tok = torch.multinomial(lp.exp(), 1, generator=g)
                step_ids.append((tok.squeeze(1), lp.gather(1, tok).squeeze(1)))
                ids = torch.cat([ids, tok], 1)
            for b in range(B):
                if not alive[b]:
                    continue
                toks = [int(t[b]) for t, _ in step_ids]
                outputs[b] += toks
                logps[b] += [float(lp[b]) for _, lp in step_ids]
                turn_ids[b] += [turn] * NEW
                rewards[b][turn] = sum(t % 2 == 0 for t in toks) / NEW
                alive[b] = toks[-1] % 2 == parity and turn < TURNS - 1
                if alive[b]:
                    outputs[b].append(ENV_TOKEN)
                    logps[b].append(0.0)
                    turn_ids[b].append(-1)
            ids = torch.cat([ids, torch.full((B, 1), ENV_TOKEN)], 1)
            if not any(alive):
                break
    batch = trajectory_from_tokens(
        [p.tolist() for p in prompts], outputs, logps, [[0] * len(o) for o in outputs],
        output_loss_mask=[[int(t >= 0) for t in ts] for ts in turn_ids], output_turn_ids=turn_ids,
        turn_rewards=rewards,
    )  # fmt: skip
    batch["rewards"] = torch.tensor([sum(r.values()) for r in rewards])
    return batch


def run(
    model_dir: str,
    estimator: str = "turn_loo",
    steps: int = STEPS,
    seed: int = 5,
    lr: float = 0.01,
    parity: int = 0,
    after_step: Callable[[int, torch.nn.Module], None] | None = None,
) -> tuple[list[float], torch.nn.Module]:
    """Mean episode return of each step's batch, training with `estimator` (a `sequence` run is
    credited the episode's return); and the sampler, holding the trained weights. `after_step(k,
    sampler)` runs after step k's weights reach the sampler (benchmarks/turn_credit.py evaluates)."""
    cfg = PPOActorConfig(path=model_dir, dtype="float32", mb_spec=MicroBatchSpec(n_mbs=1), adv_estimator=estimator,
                         optimizer=OptimizerConfig(lr=lr))  # fmt: skip
    actor = PPOActor(cfg, GenerationHyperparameters(group_size=GROUP), total_train_steps=steps).initialize()
    sampler = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    vocab = sampler.config.vocab_size
    returns = []
    try:
        for _ in range(steps):
            prompts = torch.randint(0, vocab, (PROMPTS, PROMPT_LEN), generator=g).repeat_interleave(GROUP, 0)
            batch = rollout_episodes(sampler, prompts, g, parity)
            actor.compute_advantages(batch)
            actor.ppo_update(batch)
            assert not sampler.load_state_dict(dict(actor.export_weights()), strict=False).unexpected_keys
            returns.append(float(batch["rewards"].mean()))
            if after_step is not None:
                after_step(len(returns), sampler)
    finally:
        actor.destroy()
    return returns, sampler


def test_per_turn_credit_raises_the_return(tiny_model_dir) -> None:
    returns, _ = run(tiny_model_dir)
    first, last = sum(returns[:WINDOW]) / WINDOW, sum(returns[-WINDOW:]) / WINDOW
    print(f"turn_loo: mean episode return, first {WINDOW} steps {first:.3f}, last {WINDOW} steps {last:.3f}")
    assert last >= first + MARGIN, f"per-turn credit did not learn: {first:.3f} -> {last:.3f} ({returns})"

"""`Evaluator`: held-out accuracy through the inference servers, reproducible sample for sample.

Each trainer rank evaluates its shard of the held-out records (k seeded samples per prompt at
`evaluator.temperature`) and the per-prompt metrics are summed over ranks, so every rank
returns the same numbers. Sampling seeds derive from `evaluator.seed`, the record id, the
sample index and the weight version (`arealite.workflow.seeding`): the standalone
`python -m arealite.eval` on the saved weights of version v draws the same samples and
reproduces the in-training number.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from arealite import world
from arealite.config import EvaluatorConfig, GenerationHyperparameters
from arealite.eval.metrics import extract_answer, prompt_metrics
from arealite.interfaces import InferenceEngine
from arealite.workflow import RLVRWorkflow


def eval_gconfig(config: EvaluatorConfig, gconfig: GenerationHyperparameters) -> GenerationHyperparameters:
    """The training sampling settings with the evaluation's k, temperature, budget and seed."""
    return dataclasses.replace(
        gconfig,
        group_size=config.k,
        temperature=config.temperature,
        max_new_tokens=config.max_new_tokens or gconfig.max_new_tokens,
        sampling_seed=config.seed,
    )


class Evaluator:
    """Held-out evaluation with a rollout engine; `evaluate()` is collective over trainer ranks.

    `reward_pool` lets the training workflow's pool be shared (worker start-up is slow).
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        gconfig: GenerationHyperparameters,
        records: list[dict[str, Any]],
        reward_fn: Any,
        tokenizer: Any,
        rank: int = 0,
        world_size: int = 1,
        reward_pool: Any = None,
    ) -> None:
        if not records:
            raise ValueError("Evaluator got no held-out records; check valid_dataset / evaluator.num_samples")
        self.config = config
        self.tokenizer = tokenizer
        chosen = records[: config.num_samples] if config.num_samples else records
        self.n_prompts = len(chosen)
        self.records = chosen[rank::world_size]
        self.workflow = RLVRWorkflow(reward_fn, eval_gconfig(config, gconfig), tokenizer, reward_pool)

    def should_run(self, version: int, total_steps: int) -> bool:
        """At weight version 0 (before training), every `freq_steps` versions, and after the last step."""
        f = self.config.freq_steps
        return f > 0 and (version % f == 0 or version == total_steps)

    def evaluate(self, rollout: InferenceEngine) -> dict[str, float]:
        """`eval/pass@1`, `eval/pass@k`, `eval/maj@k`, `eval/n_prompts`, `eval/time_s` over all ranks."""
        started = time.monotonic()
        k = self.config.k
        sums = {"pass@1": 0.0, f"pass@{k}": 0.0, f"maj@{k}": 0.0}
        if self.records:
            batch = rollout.rollout_batch(self.records, self.workflow)
            for answers, rewards in self._groups(batch):
                for name, value in prompt_metrics(answers, rewards, k).items():
                    sums[name] += value
        names = sorted(sums)
        totals = torch.tensor([sums[n] for n in names] + [len(self.records)], dtype=torch.float64)
        world.all_reduce(totals, "sum")
        n = totals[-1].item()
        if n != self.n_prompts:
            raise RuntimeError(
                f"evaluated {n:.0f} of {self.n_prompts} prompts: a reward failed for some (see the workflow stats)"
            )
        out = {f"eval/{name}": totals[i].item() / n for i, name in enumerate(names)}
        out.update({"eval/n_prompts": n, "eval/time_s": time.monotonic() - started})
        return out

    def _groups(self, batch: dict[str, torch.Tensor]):
        """(answers, rewards) of each prompt: k consecutive rows of the batch."""
        k = self.config.k
        mask = batch["loss_mask"].bool()
        texts = [
            self.tokenizer.decode(ids[m].tolist(), skip_special_tokens=True) for ids, m in zip(batch["input_ids"], mask)
        ]
        rewards = batch["rewards"].tolist()
        for g in range(0, len(texts), k):
            yield [extract_answer(t) for t in texts[g : g + k]], rewards[g : g + k]

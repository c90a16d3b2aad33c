"""Supervised fine-tuning on the training engine: next-token loss on completion tokens only.

A record is a prompt (chat `messages`, `prompt` text, or `input_ids`) plus a completion
(`completion` text, else the record's `answer`) that ends with the tokenizer's EOS. The batch
follows docs/architecture.md §5 — `loss_mask` is 1 on completion tokens — so `FSDPEngine.train_batch`
packs it (no padding in the forward pass) and splits it by the token budget like any PPO
batch. The loss is the mean negative log-likelihood over all completion tokens of the global
batch (every rank's tokens weigh the same).

Deliberately absent: multi-turn masking and chat-template rendering of the completion; a
workflow-specific format belongs in the records.
"""

from __future__ import annotations

from typing import Any

import torch

from arealite.data.packing import Batch
from arealite.train.engine import FSDPEngine
from arealite.train.logprobs import packed_token_logprobs
from arealite.workflow.prompt import encode_prompt


def completion_text(record: dict[str, Any]) -> str:
    """The supervised target of a record: `completion`, else `solution` (GSM8K's worked answer), else `answer`."""
    for key in ("completion", "solution", "answer"):
        if key in record:
            return str(record[key])
    raise KeyError(f"SFT record (keys {sorted(record)}) has no target; give it 'completion' or 'answer'")


def sft_batch(records: list[dict[str, Any]], tokenizer: Any) -> Batch:
    """Padded batch `input_ids, attention_mask, loss_mask` [B, T] of prompt + completion + EOS."""
    if not records:
        raise ValueError("sft_batch needs at least one record")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id; SFT completions must end with EOS")
    rows = []
    for r in records:
        prompt = encode_prompt(tokenizer, r)
        completion = list(tokenizer.encode(completion_text(r), add_special_tokens=False)) + [tokenizer.eos_token_id]
        rows.append((prompt, completion))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, T]
    attn = torch.zeros(len(rows), width, dtype=torch.bool)  # [B, T]
    mask = torch.zeros(len(rows), width, dtype=torch.int32)  # [B, T]
    for b, (p, c) in enumerate(rows):
        ids[b, : len(p) + len(c)] = torch.tensor(p + c)
        attn[b, : len(p) + len(c)] = True
        mask[b, len(p) : len(p) + len(c)] = 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": mask}


def sft_loss(logits: torch.Tensor, mb: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean NLL over the completion tokens of one packed micro-batch; logits [N, V]."""
    logp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])  # [N], token-aligned
    mask = mb["loss_mask"].to(logp.device).bool()  # [N]
    n = mask.sum().clamp(min=1)
    nll = -(logp * mask).sum() / n
    with torch.no_grad():
        pred = torch.cat([mb["input_ids"].new_zeros(1), logits[:-1].argmax(-1).to(mb["input_ids"].device)])
        acc = ((pred == mb["input_ids"]).to(logp.device) & mask).sum() / n
    return nll, {"token_accuracy": acc}


def _loss_tokens(mb: Batch) -> float:
    return float(mb["loss_mask"].sum())


def sft_step(engine: FSDPEngine, batch: Batch) -> dict[str, float]:
    """One optimizer step of SFT on this rank's `batch`; collective. Returns stats reduced over ranks."""
    if "loss_mask" not in batch:
        raise KeyError("sft_step needs batch['loss_mask'] (1 on completion tokens); build it with sft_batch")
    return engine.train_batch(batch, sft_loss, _loss_tokens)

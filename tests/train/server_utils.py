"""Talking to the built-in server from training tests: generate, and turn results into batches."""

from __future__ import annotations

import torch


def generate(server, prompts: list[list[int]], sampling_params: dict) -> list[dict]:
    """One /generate per prompt with logprobs; returns the result objects."""
    out = []
    for ids in prompts:
        status, body = server.post(
            "/generate", {"input_ids": ids, "sampling_params": sampling_params, "return_logprob": True}, timeout=120
        )
        assert status == 200, body
        out.append(body)
    return out


def batch_from_results(prompts: list[list[int]], results: list[dict]) -> dict:
    """A padded trajectory batch (docs/architecture.md §5) from prompts and their /generate results."""
    rows = []
    for ids, res in zip(prompts, results):
        triples = res["meta_info"]["output_token_logprobs"]
        rows.append((ids, [t[1] for t in triples], [t[0] for t in triples]))
    T = max(len(p) + len(o) for p, o, _ in rows)
    B = len(rows)
    batch = {k: torch.zeros(B, T, dtype=torch.long) for k in ("input_ids", "attention_mask", "loss_mask")}
    batch["logprobs"] = torch.zeros(B, T)
    for b, (p, o, lp) in enumerate(rows):
        n = len(p) + len(o)
        batch["input_ids"][b, :n] = torch.tensor(p + o)
        batch["attention_mask"][b, :n] = 1
        batch["loss_mask"][b, len(p) : n] = 1
        batch["logprobs"][b, len(p) : n] = torch.tensor(lp)
    batch["rewards"] = torch.zeros(B)
    return batch


def mean_abs_logprob_diff(logp: torch.Tensor, batch: dict) -> float:
    mask = batch["loss_mask"].bool()
    return float((logp - batch["logprobs"])[mask].abs().mean())

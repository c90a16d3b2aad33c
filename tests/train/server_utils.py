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
    return batch_from_rows(rows)


def batch_from_responses(responses) -> dict:
    """The same from the rollout client's `ModelResponse`s."""
    return batch_from_rows([(r.input_tokens, r.output_tokens, r.output_logprobs) for r in responses])


def batch_from_rows(rows: list[tuple[list[int], list[int], list[float]]]) -> dict:
    """A padded batch from (prompt, output tokens, their logprobs) rows; the outputs are the loss tokens."""
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


def max_abs_logprob_diff(logp: torch.Tensor, batch: dict) -> float:
    mask = batch["loss_mask"].bool()
    return float((logp - batch["logprobs"])[mask].abs().max())


def max_parity_bound(batch: dict, hidden: int) -> float:
    """fp32 rounding of any one logprob through `hidden`-long dot products, relative to the
    batch's largest |logprob| (tests/tolerance.py): the bound on the max |diff|."""
    from tests.tolerance import tolerance

    mask = batch["loss_mask"].bool()
    return tolerance(torch.float32, hidden) * float(batch["logprobs"][mask].abs().max())


def moved_trainer(model_path: str, out_dir: str, lr: float = 3e-2):
    """An fp32 FSDPEngine on `model_path` after one large NLL step, its weights saved to `out_dir`
    (HF folder): weights a server can only serve by loading them."""
    from arealite.algo.losses import token_mean
    from arealite.config import OptimizerConfig, TrainEngineConfig
    from arealite.train.engine import FSDPEngine
    from arealite.train.logprobs import packed_token_logprobs
    from tests.train.helpers import make_batch

    def nll(logits, mb):
        lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
        return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}

    engine = FSDPEngine(
        TrainEngineConfig(path=model_path, dtype="float32", optimizer=OptimizerConfig(lr=lr))
    ).initialize()
    engine.train_batch(make_batch([12, 9, 10], seed=21), nll, lambda mb: float(mb["loss_mask"].sum()))
    engine.save(out_dir)
    return engine


def trainer_logprobs(engine, batch: dict) -> torch.Tensor:
    """The trainer's logprobs [B, T] of `batch`'s tokens at temperature 1."""
    from arealite.train.logprobs import batch_token_logprobs

    return batch_token_logprobs(engine, batch, 1.0)


def reference_logprobs(model_path: str, batch: dict) -> torch.Tensor:
    """Logprobs [B, T] of `batch`'s tokens under the HF model in `model_path` (fp32, each row alone)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b, n in enumerate(batch["attention_mask"].sum(-1).tolist()):
            ids = batch["input_ids"][b : b + 1, :n]
            logits = model(input_ids=ids).logits[0, :-1].float()
            out[b, 1:n] = logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return out * batch["loss_mask"]

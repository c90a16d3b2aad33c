"""Token-aligned log-probabilities from packed logits.

Position `t` of the result holds `log p(token t | tokens < t)` (docs/architecture.md §5), computed from
the logits at position `t - 1` divided by the sampling temperature — the same quantity the
servers return. With a `truncation` (`gconfig.logprob_truncation`: top-k / top-p / min-p with
`gconfig.truncated_logprobs`), p is the truncated, renormalised distribution the tokens were
sampled from (arealite/truncation.py), which the built-in server reports for
`processed_logprobs` requests. The first token of every sequence has no prediction and gets 0.
"""

from __future__ import annotations

import torch

from arealite.truncation import Truncation, truncated_token_logprobs


def packed_token_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    temperature: float = 1.0,
    truncation: Truncation | None = None,
) -> torch.Tensor:
    """logits [N, V] (position i predicts token i+1), input_ids [N] -> logprobs [N] in fp32."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 to define logprobs; greedy rollouts use 1.0")
    n = logits.shape[0]
    out = logits.new_zeros(n, dtype=torch.float32)
    if n < 2:
        return out
    scaled = logits[:-1].float() / temperature  # [N-1, V]
    nxt = input_ids[1:].to(logits.device)  # the token each position predicts
    if truncation is not None:
        lp = truncated_token_logprobs(scaled, nxt, truncation)
    else:
        # logp = logit[target] - logsumexp: no [N, V] log-softmax tensor is materialized.
        lp = scaled.gather(-1, nxt[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)
    out = torch.cat([out[:1], lp])
    starts = cu_seqlens[:-1].long().to(out.device)
    # A sequence's first token is "predicted" by the previous sequence's last position: drop it.
    return out.index_fill(0, starts, 0.0)


def batch_token_logprobs(engine, batch: dict, temperature: float, truncation: Truncation | None = None) -> torch.Tensor:
    """`engine.forward` -> logprobs [B, T]; 0 at t = 0, on padding and outside `loss_mask`."""
    hook = lambda logits, mb: packed_token_logprobs(  # noqa: E731
        logits, mb["input_ids"], mb["cu_seqlens"], temperature, truncation
    )
    logp = engine.forward(batch, hook)
    keep = batch["attention_mask"].bool()
    if "loss_mask" in batch:
        keep = keep & batch["loss_mask"].bool()
    return torch.where(keep.to(logp.device), logp, torch.zeros_like(logp))

"""The LM head chunked through the loss: log-probs and entropy without the [N, V] logits.

A causal LM's head turns the final hidden states [N, H] into logits [N, V] = hidden @ weight.T;
with a 150k vocabulary those logits, and their gradient, outweigh everything else a long
micro-batch holds. When the engine's `head_chunk_tokens` is set and the loss asks for it
(`accepts_hidden_states`), the model's forward stops before the head and the loss gets a
`HiddenStates` instead of logits; `arealite.train.logprobs` then makes each `chunk`-row block
of logits, reads what it needs and frees it, in forward, and again in backward, where the
block's gradient goes straight into grad_hidden and grad_weight. Nothing else changes: each
block goes through the same per-row functions as full logits (temperature, truncation,
entropy), so values and gradients are today's to rounding. Tied embeddings need nothing: the
head's weight is the embedding's, and both gradients land on it.

Only heads whose model returns `lm_head(hidden)` as its logits are chunked (PLAIN_HEAD_MODELS);
another model (logit soft-capping, logit scaling, a LoRA on the head) keeps full logits.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# model_type -> whose CausalLM forward returns `self.lm_head(hidden)` untouched (transformers 5)
PLAIN_HEAD_MODELS = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral"})
_HIDDEN_STATES_FLAG = "accepts_hidden_states"


@dataclass(frozen=True)
class HiddenStates:
    """What the LM head would turn into logits [N, V]: `hidden` [N, H] (after the final norm)
    and the head's `weight` [V, H]; `chunk` rows of logits are made at a time."""

    hidden: torch.Tensor
    weight: torch.Tensor
    chunk: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.hidden.shape[0], self.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.hidden.device


def accepts_hidden_states(fn):
    """Mark a loss function or forward hook as one that reads its logits only through
    `arealite.train.logprobs` (so it may get a `HiddenStates`); returns `fn`."""
    setattr(fn, _HIDDEN_STATES_FLAG, True)
    return fn


def takes_hidden_states(fn) -> bool:
    return bool(getattr(fn, _HIDDEN_STATES_FLAG, False))


def plain_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head if its logits are `head(hidden)` and nothing more; else None."""
    if getattr(model.config, "model_type", None) not in PLAIN_HEAD_MODELS:
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    return head


def warn_unchunked(model: torch.nn.Module) -> None:
    warnings.warn(
        f"head_chunk_tokens: the LM head of {type(model).__name__} (model_type "
        f"{getattr(model.config, 'model_type', None)!r}) is not a plain Linear whose output is the logits; "
        "its full [tokens, vocab] logits are made as before",
        stacklevel=3,
    )


@contextmanager
def hidden_states_out(head: torch.nn.Linear) -> Iterator[dict]:
    """While open, `head` returns its input: the model's `logits` are the final hidden states.
    The dict yielded receives the head's weight as the forward saw it (under FSDP2, the
    unsharded parameter, whose gradient FSDP reduces)."""
    seen: dict = {}

    def passthrough(hidden: torch.Tensor) -> torch.Tensor:
        seen["weight"] = head.weight
        return hidden.clone() if hidden._is_view() else hidden  # FSDP2 warns of a view returned by its root

    head.forward = passthrough
    try:
        yield seen
    finally:
        del head.forward


class ChunkedHead(torch.autograd.Function):
    """rows.forward(hidden[block] @ weight.T, targets[block], block start) over `chunk`-row blocks -> (lp, ent).

    `rows` (arealite/train/logprobs.py `_Rows`) maps a block of logits and its targets to
    (values, entropy or None, what its gradient needs: small, kept), and gives the block's
    gradient from those. Forward keeps no logits; backward makes each block again and adds
    grad_block @ weight into grad_hidden and grad_block.T @ hidden into grad_weight
    (accumulated in fp32 at least). The entropy carries a gradient only with `entropy_grad`.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, chunk: int, entropy_grad: bool):
        lps, ents, kept = [], [], []
        for i, (h, t) in enumerate(zip(hidden.split(chunk), targets.split(chunk))):
            lp, ent, keep = rows.forward(F.linear(h, weight), t, i * chunk)
            lps.append(lp)
            ents.append(ent)
            kept.append(keep)
        lp = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
        ent = torch.cat(ents) if ents and ents[0] is not None else None
        if ent is not None and not entropy_grad:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(hidden, weight, targets)
        ctx.rows, ctx.chunk, ctx.kept = rows, chunk, kept
        ctx.entropy_grad = entropy_grad and ent is not None
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, targets = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(hidden) if want_h else None
        wide = torch.promote_types(weight.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if want_w else None
        block_w = None if wide == weight.dtype else torch.empty_like(weight)  # one product at a time, then added
        start = 0
        for i, (h, t) in enumerate(zip(hidden.split(ctx.chunk), targets.split(ctx.chunk))):
            rows = slice(start, start + h.shape[0])
            start = rows.stop
            g_ent = grad_ent[rows] if ctx.entropy_grad and grad_ent is not None else None
            g = ctx.rows.grad(F.linear(h, weight), t, rows.start, ctx.kept[i], grad_lp[rows], g_ent).to(hidden.dtype)
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[rows])
            if grad_w is not None:
                if block_w is None:
                    grad_w.addmm_(g.T, h)
                else:
                    grad_w.add_(torch.mm(g.T, h, out=block_w))
            del g
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None, None

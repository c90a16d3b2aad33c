"""Token-aligned log-probabilities from packed logits.

Position `t` of the result holds `log p(token t | tokens < t)` (docs/architecture.md §5), computed from
the logits at position `t - 1` divided by the sampling temperature — the same quantity the
servers return. With a `truncation` (`gconfig.logprob_truncation`: top-k / top-p / min-p with
`gconfig.truncated_logprobs`), p is the truncated, renormalised distribution the tokens were
sampled from (arealite/algo/truncation.py), which the built-in server reports for
`processed_logprobs` requests; at the tokens a batch marks `stop_banned` (`gconfig.min_new_tokens`),
p is without `stop_ids`, as on the servers (`StopBan`, docs/protocol.md §1.6.1). The first token
of every sequence has no prediction and gets 0.

Without a truncation the log-probs (and, beside them, the entropy statistic) come from one
fused autograd function whose backward writes the logits' gradient in a single buffer; the
same formula through autograd's generic ops costs about twice the time over the [N, V] logits.
Every function here that takes `logits` also takes a `HiddenStates` (arealite/train/lm_head.py):
then the same per-row computation runs on blocks of logits made from the hidden states, and
the [N, V] logits never exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arealite.algo.losses import entropy_from_logits
from arealite.algo.truncation import Truncation, truncated_token_logprobs
from arealite.train.lm_head import ChunkedHead, HiddenStates, accepts_hidden_states

ENTROPY_CHUNK = 1024  # rows per [chunk, V] fp32 temporary (entropy, gradient): a large vocabulary never needs more

BANNED_LOGIT = -1e30  # a banned stop token's logit / T: exp underflows to 0 below any real logit (fp32)


@dataclass(frozen=True)
class StopBan:
    """The stop tokens `ids` [s] banned at the logits rows `rows` [k] (ascending): out of the
    distribution, as a server honouring `min_new_tokens` removes them. Their scaled logits become
    BANNED_LOGIT, not -inf: p = exp(x - logz) is still exactly 0, and p * x in the entropy (and its
    gradient, x times the loss's) stays finite, where -inf (or the dtype's minimum, which a
    gradient overflows) would make it NaN."""

    rows: torch.Tensor
    ids: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """`x` (fp32 logits already / T) with the banned entries at BANNED_LOGIT; a copy (autograd-safe)."""
        return x.index_put((self.rows[:, None], self.ids[None, :]), x.new_tensor(BANNED_LOGIT))

    def block(self, start: int, stop: int) -> StopBan | None:
        """The ban of rows [start, stop), renumbered from 0; None when none of them is banned."""
        inside = (self.rows >= start) & (self.rows < stop)
        return StopBan(self.rows[inside] - start, self.ids) if bool(inside.any()) else None


def stop_ban(banned: torch.Tensor | None, stop_ids: Sequence[int], targets: torch.Tensor) -> StopBan | None:
    """The `StopBan` of packed rows predicting `targets` [n], from the token-aligned `banned` [n + 1]
    (the batch's `stop_banned`: row t predicts token t + 1); None when no token is banned."""
    if banned is None:
        return None
    rows = banned[1:].to(targets.device).bool().nonzero().squeeze(1)
    if rows.numel() == 0:
        return None
    if not stop_ids:
        raise ValueError(
            "the batch marks tokens sampled under gconfig.min_new_tokens's stop-token ban (stop_banned) but no "
            "stop ids were given to replay it: pass stop_ids (arealite.utils.stop_ids.banned_stop_ids)"
        )
    ids = torch.as_tensor(list(stop_ids), dtype=torch.long, device=targets.device)
    if bool((targets[rows, None] == ids[None, :]).any()):
        raise ValueError(
            f"a token marked stop_banned is itself one of the banned stop ids {sorted(stop_ids)}: the servers "
            "never sample one under the ban, so the batch's stop_banned or the stop ids (the model's EOS, "
            "gconfig.stop_token_ids) are not the server's"
        )
    return StopBan(rows, ids)


class _NextTokenLogprobs(torch.autograd.Function):
    """log softmax(logits[t] / T)[targets[t]] for rows t < n = len(targets) of logits [M >= n, V], fused.

    Forward keeps no [M, V] temporary beyond what the ops need; backward writes the gradient
    of the whole logits tensor in one buffer: -g * softmax, plus g at each target, and zero
    for the rows past n (the last row of a packed micro-batch predicts nothing here).
    Autograd's own version of the same formula allocates and zero-fills several [N, V] tensors
    (the slice, the gather, the division by T). With `entropy`, also returns the
    (non-differentiable) entropy of each row's distribution, from the same log-normaliser.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool, ban):
        lp, ent, logz = _fused_forward(logits, targets, temperature, entropy, ban)
        if ent is not None:
            ctx.mark_non_differentiable(ent)
        ctx.save_for_backward(logits, targets, logz)
        ctx.temperature, ctx.ban = temperature, ban
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp: torch.Tensor, _grad_ent: torch.Tensor | None):
        logits, targets, logz = ctx.saved_tensors
        return _fused_grad(logits, targets, logz, grad_lp, ctx.temperature, ctx.ban), None, None, None, None


def _fused_forward(logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool, ban=None):
    """(log-probs [n], entropy [n] or None, log-normaliser [n]) of rows t < n = len(targets)."""
    x = _scaled(logits[: targets.shape[0]], temperature)
    if ban is not None:
        x = ban.apply(x)
    logz = torch.logsumexp(x, dim=-1)
    lp = x.gather(-1, targets[:, None]).squeeze(-1) - logz
    ent = torch.cat([_entropy(c, z) for c, z in _chunks(x, logz)]) if entropy else None
    return lp, ent, logz


def _fused_grad(logits, targets, logz, grad_lp, t: float, ban: StopBan | None = None) -> torch.Tensor:
    """d(sum grad_lp * log-probs)/d logits, in one [M, V] buffer of the logits' dtype."""
    wide = torch.promote_types(logits.dtype, torch.float32)
    g = grad_lp.to(wide) / t if t != 1.0 else grad_lp.to(wide)  # d/dlogits = d/dx / T
    grad = torch.empty(logits.shape, dtype=wide, device=logits.device)
    n = targets.shape[0]
    body = grad[:n]
    for rows, c, z, gc in _chunks(body, logits[:n], logz, g):
        torch.sub(_scaled(c, t), z[:, None], out=rows)
        rows.exp_().mul_(-gc[:, None])  # -g * softmax
    if ban is not None:  # the banned logits are out of the softmax: no gradient
        body.index_put_((ban.rows[:, None], ban.ids[None, :]), body.new_zeros(()))
    body.scatter_add_(1, targets[:, None], g[:, None])
    grad[n:] = 0.0
    return grad.to(logits.dtype)


class _Rows:
    """One block of rows for `ChunkedHead`: log-probs and entropy of a [rows, V] block of logits,
    and the block's gradient. Untruncated with a gradient-free entropy (the default), the fused
    formulas above, saving the block's log-normaliser; otherwise autograd through `_rows_logprobs`
    on the block made again."""

    def __init__(
        self,
        temperature: float,
        truncation: Truncation | None,
        entropy: bool,
        entropy_grad: bool,
        ban: StopBan | None = None,
    ):
        self.args = (temperature, truncation, entropy, entropy_grad)
        self.fused = truncation is None and not (entropy and entropy_grad)
        self.ban = ban

    def _ban(self, start: int, n: int) -> StopBan | None:
        return self.ban.block(start, start + n) if self.ban is not None else None

    def forward(self, logits: torch.Tensor, targets: torch.Tensor, start: int):
        temperature, _, entropy, _ = self.args
        ban = self._ban(start, targets.shape[0])
        if self.fused:
            return _fused_forward(logits, targets, temperature, entropy, ban)
        return (*_rows_logprobs(logits, targets, *self.args, ban), None)

    def grad(self, logits, targets, start: int, logz, grad_lp, grad_ent) -> torch.Tensor:
        ban = self._ban(start, targets.shape[0])
        if self.fused:
            return _fused_grad(logits, targets, logz, grad_lp, self.args[0], ban)
        with torch.enable_grad():
            x = logits.detach().requires_grad_(True)
            lp, ent = _rows_logprobs(x, targets, *self.args, ban)
            outs, grads = [lp], [grad_lp]
            if ent is not None and ent.requires_grad and grad_ent is not None:
                outs.append(ent)
                grads.append(grad_ent)
            return torch.autograd.grad(outs, x, grads)[0]


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / T in fp32 or wider (a view, no copy, for fp32 logits at T = 1)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return x / temperature if temperature != 1.0 else x


def _token_aligned(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Values of rows 0..N-2 moved to the token they predict ([N-1] -> [N]); 0 at each sequence's first token."""
    out = torch.cat([values.new_zeros(1), values])
    starts = cu_seqlens[:-1].long().to(out.device)
    # A sequence's first token is "predicted" by the previous sequence's last position: drop it.
    return out.index_fill(0, starts, 0.0)


def packed_token_logprobs(
    logits: torch.Tensor | HiddenStates,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    temperature: float = 1.0,
    truncation: Truncation | None = None,
    stop_banned: torch.Tensor | None = None,
    stop_ids: Sequence[int] = (),
) -> torch.Tensor:
    """logits [N, V] (position i predicts token i+1), input_ids [N] -> logprobs [N] in fp32."""
    return packed_logprobs_and_entropy(
        logits, input_ids, cu_seqlens, temperature, truncation, False, stop_banned=stop_banned, stop_ids=stop_ids
    )[0]


def packed_logprobs_and_entropy(
    logits: torch.Tensor | HiddenStates,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor,
    temperature: float = 1.0,
    truncation: Truncation | None = None,
    entropy: bool = True,
    entropy_grad: bool = False,
    stop_banned: torch.Tensor | None = None,
    stop_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [N], entropy [N] or None), fp32 and token-aligned alike.

    The entropy at token t is that of softmax(logits[t-1] / T), the distribution the token
    was sampled from (untruncated even with a `truncation`), without a gradient unless
    `entropy_grad` (an entropy bonus: then one more softmax through autograd); without it, it
    costs two passes over the logits beside the log-probs' own, as it shares their log-normaliser.
    `stop_banned` [N] (bool, token-aligned) marks the tokens sampled without `stop_ids`
    (min_new_tokens): their log-probs and entropy are the banned distribution's (module docstring).
    """
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 to define logprobs; greedy rollouts use 1.0")
    n = logits.shape[0]
    if n < 2:
        zeros = torch.zeros(n, dtype=torch.float32, device=logits.device)
        return zeros, (zeros.clone() if entropy else None)
    nxt = input_ids[1:].to(logits.device)  # the token each position predicts
    ban = stop_ban(stop_banned, stop_ids, nxt)
    if isinstance(logits, HiddenStates):
        rows = _Rows(float(temperature), truncation, entropy, entropy_grad, ban)
        grad = entropy and entropy_grad
        lp, ent = ChunkedHead.apply(logits.hidden[:-1], logits.weight, nxt, rows, logits.chunk, grad)
    else:
        lp, ent = _rows_logprobs(logits, nxt, float(temperature), truncation, entropy, entropy_grad, ban)
    return _token_aligned(lp, cu_seqlens), (_token_aligned(ent, cu_seqlens) if ent is not None else None)


def _rows_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    truncation: Truncation | None,
    entropy: bool,
    entropy_grad: bool,
    ban: StopBan | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(targets[t]), entropy or None) of rows t < n = len(targets) of logits [M >= n, V]."""
    n = targets.shape[0]
    ent = None

    def scaled(x: torch.Tensor) -> torch.Tensor:
        x = _scaled(x[:n], temperature)
        return ban.apply(x) if ban is not None else x

    if truncation is not None:
        lp = truncated_token_logprobs(scaled(logits), targets, truncation)
        if entropy and not entropy_grad:
            with torch.no_grad():
                ent = torch.cat([entropy_from_logits(c) for (c,) in _chunks(scaled(logits.detach()))])
    else:
        lp, ent = _NextTokenLogprobs.apply(logits, targets, temperature, entropy and not entropy_grad, ban)
    if entropy and entropy_grad:
        ent = entropy_from_logits(scaled(logits))
    return lp, ent


def packed_token_entropy(
    logits: torch.Tensor | HiddenStates, cu_seqlens: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """The entropy of `packed_logprobs_and_entropy`, token-aligned [N], WITH its gradient (an
    entropy bonus); one [N, V] fp32 softmax through autograd (a block at a time from a `HiddenStates`)."""
    if isinstance(logits, HiddenStates):
        ids = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)  # a target is needed; unused
        return packed_logprobs_and_entropy(logits, ids, cu_seqlens, temperature, entropy_grad=True)[1]
    if logits.shape[0] < 2:
        return logits.new_zeros(logits.shape[0], dtype=torch.float32)
    return _token_aligned(entropy_from_logits(_scaled(logits[:-1], temperature)), cu_seqlens)


def _entropy(x: torch.Tensor, logz: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(x) per row, given its log-normaliser logz = logsumexp(x)."""
    return logz - (torch.exp(x - logz[:, None]) * x).sum(-1)


def _chunks(*tensors: torch.Tensor):
    """The tensors' rows, ENTROPY_CHUNK at a time, side by side."""
    return zip(*(t.split(ENTROPY_CHUNK) for t in tensors))


def batch_token_logprobs(
    engine, batch: dict, temperature: float, truncation: Truncation | None = None, stop_ids: Sequence[int] = ()
) -> torch.Tensor:
    """`engine.forward` -> logprobs [B, T]; 0 at t = 0, on padding and outside `loss_mask`; the
    tokens `batch["stop_banned"]` marks without `stop_ids` (module docstring)."""
    hook = accepts_hidden_states(
        lambda logits, mb: packed_token_logprobs(
            logits, mb["input_ids"], mb["cu_seqlens"], temperature, truncation, mb.get("stop_banned"), stop_ids
        )
    )
    logp = engine.forward(batch, hook)
    keep = batch["attention_mask"].bool()
    if "loss_mask" in batch:
        keep = keep & batch["loss_mask"].bool()
    return torch.where(keep.to(logp.device), logp, torch.zeros_like(logp))

"""The trainer replays `gconfig.min_new_tokens`'s ban on the stop tokens (arealite/train/logprobs.py).

The reference below is the ban written plainly: the logits of the stop ids at -inf on the rows
that predict a token marked `stop_banned`, then log_softmax(logits / T) at the next token, or,
with a truncation, the log-normaliser over the kept set of the banned distribution; the entropy
is the banned distribution's. The trainer's three paths (the fused untruncated one, the
truncated one, the chunked head) must give the same log-probs, entropy and gradients, with no
NaN where the banned logits meet the entropy's p * x.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arealite.algo.truncation import Truncation
from arealite.train.lm_head import HiddenStates
from arealite.train.logprobs import packed_logprobs_and_entropy
from tests.tolerance import assert_close, magnitude, tolerance
from tests.train.helpers import plain_next_token_logprobs, token_aligned

N, H, V = 41, 16, 50
STOP_IDS = [3, 11]
CU = torch.tensor([0, 5, 23, N])


def _reference(logits, ids, banned, t: float, truncation: Truncation | None):
    """(logprobs [N], entropy [N]) token-aligned, the ban as -inf logits, through plain autograd."""
    x = logits[:-1] / t
    ban = torch.zeros_like(x, dtype=torch.bool)
    ban[banned[1:].nonzero().squeeze(1)[:, None], torch.tensor(STOP_IDS)[None, :]] = True
    x = x.masked_fill(ban, float("-inf"))
    lp = plain_next_token_logprobs(x, ids[1:], truncation)
    ent = torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x.masked_fill(ban, 0.0)).sum(-1)  # 0 * -inf: 0
    return token_aligned(lp, CU), token_aligned(ent, CU)


def _inputs():
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(V, H, generator=g)
    hidden = torch.randn(N, H, generator=g) * 1.5
    ids = torch.randint(0, V, (N,), generator=g)
    ids[torch.isin(ids, torch.tensor(STOP_IDS))] = 7  # no banned token is a stop id
    # banned: the first tokens of each answer (prompts 5..7, 23..26 and 30..), across the chunks of 7
    banned = torch.zeros(N, dtype=torch.bool)
    banned[[6, 7, 8, 9, 10, 11, 12, 13, 14, 27, 28, 29, 36, 37, 38]] = True
    # a stop token with much of the mass on every row: the ban moves each banned token's logprob far
    hidden[:, 0], weight[STOP_IDS[0], 0] = 4.0, 8.0
    return weight, hidden, ids, banned


TRUNCATIONS = {
    "none": None,
    "joint top_k+top_p": Truncation(top_k=12, top_p=0.8),
    "sequential all": Truncation(top_k=20, top_p=0.85, min_p=0.03, rule="sequential"),
}


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("truncation", list(TRUNCATIONS))
def test_the_replayed_ban_equals_the_stop_logits_at_minus_infinity(truncation, chunked, entropy_grad):
    trunc, t = TRUNCATIONS[truncation], 0.7
    weight, hidden, ids, banned = _inputs()
    g = torch.Generator().manual_seed(2)
    w_lp, w_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)

    def run(mine: bool):
        w, h = weight.clone().requires_grad_(True), hidden.clone().requires_grad_(True)
        if mine:
            logits = HiddenStates(h, w, 7) if chunked else F.linear(h, w)
            lp, ent = packed_logprobs_and_entropy(logits, ids, CU, t, trunc, True, entropy_grad, banned, STOP_IDS)
        else:
            lp, ent = _reference(F.linear(h, w), ids, banned, t, trunc)
            ent = ent if entropy_grad else ent.detach()
        ((lp * w_lp).sum() + ((ent * w_ent).sum() if entropy_grad else 0.0)).backward()
        return lp.detach(), ent.detach(), w.grad, h.grad

    got, want = run(True), run(False)
    top = float(F.linear(hidden, weight).abs().max()) / t
    for name, a, b in zip(("logprobs", "entropy", "grad weight", "grad hidden"), got, want):
        assert torch.isfinite(a).all(), name
        assert_close(a, b, n=V, scale=top if name == "entropy" else None, msg=name)
    # the ban matters here: without it the banned tokens' logprobs are far off
    plain = packed_logprobs_and_entropy(F.linear(hidden, weight), ids, CU, t, trunc, entropy=False)[0]
    assert float((plain - want[0])[banned].abs().min()) > 0.1
    assert_close(plain[~banned], want[0][~banned], n=V)  # and nothing else moves


def test_a_ban_that_is_not_the_servers_is_refused():
    weight, hidden, ids, banned = _inputs()
    logits = F.linear(hidden, weight)
    with pytest.raises(ValueError, match="stop_ids"):
        packed_logprobs_and_entropy(logits, ids, CU, 1.0, None, stop_banned=banned)
    ids = ids.clone()
    ids[9] = STOP_IDS[1]  # a banned token that is itself a stop id: no server samples it under the ban
    with pytest.raises(ValueError, match="stop_banned"):
        packed_logprobs_and_entropy(logits, ids, CU, 1.0, None, stop_banned=banned, stop_ids=STOP_IDS)


def test_the_actor_loss_takes_the_banned_distribution():
    """`actor_loss` (the update's forward) reads `stop_banned` too: with behaviour logprobs from
    the banned distribution, the train-inference mismatch it reports is rounding, not the ban."""
    from arealite.config import PPOActorConfig
    from arealite.train.actor import actor_loss

    weight, hidden, ids, banned = _inputs()
    logits = F.linear(hidden, weight)
    behav = _reference(logits, ids, banned, 0.7, None)[0]
    loss_mask = torch.ones(N, dtype=torch.int32).index_fill(0, CU[:-1], 0)
    mb = {"input_ids": ids, "cu_seqlens": CU, "loss_mask": loss_mask, "logprobs": behav, "stop_banned": banned}
    mb["advantages"] = torch.ones(N)
    _, stats = actor_loss(logits, mb, PPOActorConfig(path="x"), 0.7, None, STOP_IDS)
    assert float(stats["logprob_mismatch_max"]) <= tolerance(torch.float32, V) * magnitude(behav)

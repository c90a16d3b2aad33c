"""The LM head chunked through the loss (arealite/train/lm_head.py) equals the full-logits head.

The reference below is the trainer's head as it was before chunking (its log-probs written plainly
in tests/train/helpers.py): the [N, V]
logits made whole by autograd, then log_softmax(logits / T) at the next token, or, with a
truncation, the log-normaliser over the kept set of arealite/algo/truncation.py (the target
always kept), and the untruncated entropy. The chunked head must give the same log-probs,
entropy and gradients (hidden states and head weight, tied or not), and the actor must use it
where the config asks (`actor.head_chunk_tokens`), and not where it is 0.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from arealite.algo.truncation import Truncation
from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.config.loading import ConfigError
from arealite.train.actor import PPOActor
from arealite.train.lm_head import HiddenStates
from arealite.train.logprobs import packed_logprobs_and_entropy, packed_token_entropy
from tests.tolerance import assert_close
from tests.train.helpers import make_batch, plain_next_token_logprobs, token_aligned

N, H, V = 41, 16, 50


def _reference(hidden, weight, ids, cu, t: float, truncation: Truncation | None):
    """The full-logits head: (logprobs [N], entropy [N]), token-aligned, through plain autograd."""
    x = F.linear(hidden, weight)[:-1] / t
    lp = plain_next_token_logprobs(x, ids[1:], truncation)
    ent = torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)  # the trainer's entropy formula
    return token_aligned(lp, cu), token_aligned(ent, cu)


def _inputs(seed: int, tied: bool):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(V, H, generator=g)
    ids = torch.randint(0, V, (N,), generator=g)
    cu = torch.tensor([0, 5, 23, N])
    mix = torch.randn(H, H, generator=g) / H**0.5
    return weight, ids, cu, mix


def _hidden(weight, ids, mix, tied: bool):
    """Hidden states from a differentiable 'body': with tied weights the head's weight is also the embedding."""
    emb = weight if tied else torch.randn(V, H, generator=torch.Generator().manual_seed(9))
    return torch.tanh(F.embedding(ids, emb) @ mix) * 2.0


TRUNCATIONS = {
    "none": None,
    "top_k": Truncation(top_k=7),
    "top_p": Truncation(top_p=0.8),
    "min_p": Truncation(min_p=0.05),
    "joint_all": Truncation(top_k=12, top_p=0.9, min_p=0.02),
    "seq_top_k": Truncation(top_k=7, rule="sequential"),
    "seq_top_p_min_p": Truncation(top_k=20, top_p=0.85, min_p=0.03, rule="sequential"),
}


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(
    "truncation,temperature", [(name, 0.7) for name in TRUNCATIONS] + [("none", 1.0), ("joint_all", 1.0)]
)
def test_chunked_head_equals_the_full_logits_head(truncation, temperature, tied, entropy_grad):
    trunc = TRUNCATIONS[truncation]
    weight, ids, cu, mix = _inputs(seed=1, tied=tied)
    g = torch.Generator().manual_seed(2)
    w_lp, w_ent = torch.randn(N, generator=g), torch.randn(N, generator=g)

    def run(chunked: bool):
        w = weight.clone().requires_grad_(True)
        m = mix.clone().requires_grad_(True)
        h = _hidden(w, ids, m, tied)
        if chunked:  # 41 rows predict 40 tokens: blocks of 7, the last one short
            lp, ent = packed_logprobs_and_entropy(
                HiddenStates(h, w, 7), ids, cu, temperature, trunc, True, entropy_grad
            )
        else:
            lp, ent = _reference(h, w, ids, cu, temperature, trunc)
            ent = ent if entropy_grad else ent.detach()
        loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if entropy_grad else 0.0)
        loss.backward()
        return lp.detach(), ent.detach(), w.grad, m.grad

    got, want = run(True), run(False)
    # fp32 sums over the vocabulary (and H-long dot products); the entropy sums p * logits / T,
    # so its rounding scales with the largest scaled logit
    top = float(F.linear(_hidden(weight, ids, mix, tied), weight).abs().max()) / temperature
    for name, a, b in zip(("logprobs", "entropy", "grad weight", "grad body"), got, want):
        assert_close(a, b, n=V, scale=top if name == "entropy" else None, msg=name)
    assert got[2].abs().max() > 0 and got[3].abs().max() > 0


def test_entropy_bonus_alone_through_the_chunked_head():
    weight, ids, cu, mix = _inputs(seed=3, tied=False)
    h = _hidden(weight, ids, mix, False).requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    packed_token_entropy(HiddenStates(h, w, 6), cu, 0.8).sum().backward()
    h2, w2 = h.detach().clone().requires_grad_(True), weight.clone().requires_grad_(True)
    _reference(h2, w2, ids, cu, 0.8, None)[1].sum().backward()
    assert_close(h.grad, h2.grad, n=V)
    assert_close(w.grad, w2.grad, n=V)


# ---- bound at the actor: actor.head_chunk_tokens ----


def test_head_chunk_tokens_must_not_be_negative():
    with pytest.raises(ConfigError, match="head_chunk_tokens=-1"):
        PPOActorConfig(path="x", head_chunk_tokens=-1)


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory) -> str:
    from arealite.tools.tiny_model import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tied")), seed=3, tie=True)


def _record_width(widths: set):
    return lambda module, inputs, out: widths.add(out.shape[-1])


def _capture_grads(actor, grads: dict):
    """A hook before the optimizer's step copying every parameter's gradient into `grads`."""

    def capture(optimizer, args, kwargs):
        for name, p in actor.model.named_parameters():
            grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()

    return capture


@pytest.mark.parametrize("tied", [False, True])
def test_actor_update_with_the_chunked_head_equals_full_logits(tied, tiny_model_dir, tied_model_dir):
    """One PPO step (entropy bonus, temperature, top-k/top-p truncation, two micro-batches) with
    head_chunk_tokens=5 vs 0: the same log-probs, stats and gradients (taken as the optimizer
    steps); and the head made [tokens, vocab] logits only when the setting was 0."""
    path = tied_model_dir if tied else tiny_model_dir
    gconfig = GenerationHyperparameters(group_size=2, temperature=0.8, top_k=40, top_p=0.9, truncated_logprobs=True)
    base = PPOActorConfig(path=path, dtype="float32", optimizer=OptimizerConfig(lr=1e-2), entropy_coef=0.01,
                          mb_spec=MicroBatchSpec(n_mbs=2))  # fmt: skip
    batch = make_batch([9, 7, 8, 6], seed=4)
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
    results = {}
    for chunk in (0, 5):
        with PPOActor(dataclasses.replace(base, head_chunk_tokens=chunk), gconfig) as actor:
            widths, grads = set(), {}
            hook = actor.model.get_output_embeddings().register_forward_hook(_record_width(widths))
            actor.optimizer.register_step_pre_hook(_capture_grads(actor, grads))
            b = {k: v.clone() for k, v in batch.items()}
            b["logprobs"] = logp = actor.compute_logp(b)
            actor.compute_advantages(b)
            stats = actor.ppo_update(b)
            hook.remove()
            results[chunk] = (logp, stats, grads, widths)
            vocab, hidden = actor.hf_config.vocab_size, actor.hf_config.hidden_size
    assert results[0][3] == {vocab} and results[5][3] == {hidden}  # chunked: the head passed its input through
    assert_close(results[5][0], results[0][0], n=hidden)
    for key in ("loss", "entropy", "grad_norm"):
        assert_close(torch.tensor(results[5][1][key]), torch.tensor(results[0][1][key]), n=vocab, msg=key)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert head in results[5][2] and results[5][2][head].abs().max() > 0
    for name, g in results[0][2].items():
        assert_close(results[5][2][name], g, n=vocab, msg=name)


def test_only_a_plain_head_is_chunked():
    """A head whose logits the model changes after the matmul (Gemma 2's soft-capping) keeps
    the whole logits; a Qwen2 head, tied or not, is chunked."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from arealite.train.lm_head import plain_head

    small = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=8)  # fmt: skip
    for tie in (False, True):
        qwen = Qwen2ForCausalLM(Qwen2Config(**small, tie_word_embeddings=tie))
        assert plain_head(qwen) is qwen.lm_head
    assert plain_head(Gemma2ForCausalLM(Gemma2Config(**small, final_logit_softcapping=30.0))) is None

"""vLLM's truncation rule as the trainer replays it, against a naive float64 reading of it,
and where the user chooses it (`server.backend` through `GRPOConfig` into `gconfig`).

The naive rule is written from vLLM 0.32's sampler as plain Python over one row: min-p on
softmax(z), then top-k by logit value (ties at the k-th value stay), then top-p on the
distribution renormalised over what is left, keeping a token while the mass of the more
likely kept tokens is below p. A row whose outcome hinges on rounding (a probability or a
cumulative mass within 1e-5 of its threshold, or two kept logits equal) is left out; the
test checks that few are. The built-in server's `joint` rule differs from it on combined
knobs, which the test checks too, so a replay that fell back to it would fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from arealite.algo.truncation import (
    TRUNCATION_RULES,
    Truncation,
    keep_mask,
    sequential_keep_mask,
    truncated_token_logprobs,
)
from arealite.config import ConfigError, GenerationHyperparameters, GRPOConfig, ServerConfig, load_config
from tests.tolerance import tolerance

VOCAB = 256
ROWS = 64
EDGE = 1e-5  # a decision this close to its threshold is rounding's, not the rule's
CASES = [  # (top_k, top_p, min_p): each knob alone, pairs, all three
    (6, 1.0, 0.0),
    (-1, 0.8, 0.0),
    (-1, 1.0, 0.05),
    (12, 0.7, 0.0),
    (-1, 0.9, 0.1),
    (20, 1.0, 0.02),
    (12, 0.6, 0.02),
]


def naive_vllm_keep(z: list[float], top_k: int, top_p: float, min_p: float) -> set[int] | None:
    """The tokens vLLM keeps for logits `z` (already / T), in float64; None when rounding decides."""
    top = max(z)
    weights = [math.exp(v - top) for v in z]
    kept = set(range(len(z)))
    if min_p > 0:
        threshold = min_p * max(weights) / sum(weights)
        probs = [w / sum(weights) for w in weights]
        if any(abs(p - threshold) <= EDGE * threshold for p in probs):
            return None
        kept = {i for i in kept if probs[i] >= threshold}
    if 0 < top_k < len(z) and len(kept) > top_k:
        kth = sorted((z[i] for i in kept), reverse=True)[top_k - 1]
        kept = {i for i in kept if z[i] >= kth}
    if top_p < 1.0:
        order = sorted(kept, key=lambda i: -z[i])
        if len({z[i] for i in order}) < len(order):
            return None  # a tie: which of two equal tokens is "more likely" is the sort's choice
        total = sum(weights[i] for i in order)
        before, survivors = 0.0, []
        for i in order:
            if abs(before - top_p) <= EDGE:
                return None
            if survivors and before >= top_p:
                break
            survivors.append(i)
            before += weights[i] / total
        kept = set(survivors)
    return kept


def random_logits(scale: float, seed: int) -> torch.Tensor:
    return torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("top_k,top_p,min_p", CASES)
def test_sequential_rule_keeps_what_vllm_keeps(top_k, top_p, min_p):
    truncation = Truncation(top_k, top_p, min_p, "sequential")
    checked = differs_from_joint = 0
    for seed, scale in enumerate((1.0, 2.5, 6.0)):  # flat to peaked rows
        scaled = random_logits(scale, seed)
        keep = sequential_keep_mask(scaled, truncation)
        joint = keep_mask(scaled, [Truncation(top_k, top_p, min_p)] * ROWS)
        for row in range(ROWS):
            expected = naive_vllm_keep(scaled[row].double().tolist(), top_k, top_p, min_p)
            if expected is None:
                continue
            checked += 1
            assert set(keep[row].nonzero()[:, 0].tolist()) == expected, (row, scale)
            differs_from_joint += int(not torch.equal(keep[row], joint[row]))
    assert checked >= 0.9 * 3 * ROWS, f"only {checked} rows were decided by the rule, not by rounding"
    knobs = (top_k > 0, top_p < 1.0, min_p > 0.0)
    if top_k > 0 and top_p < 1.0:  # top-p on the renormalised remainder: fewer tokens than joint's
        assert differs_from_joint > 0, "the case cannot tell the sequential rule from the joint one"
    if sum(knobs) == 1:  # a single knob: the same cut either way (ties and rounding aside)
        assert differs_from_joint == 0


@pytest.mark.parametrize("top_p", [1.0, 0.99])  # vLLM's top-k-only path, and its sorted path
def test_top_k_keeps_every_token_tied_with_the_kth(top_p):
    scaled = torch.full((2, 16), -4.0)
    scaled[0, :5] = torch.tensor([3.0, 2.0, 2.0, 2.0, 1.0])
    scaled[1, 7:10] = torch.tensor([0.5, 0.5, 0.5])
    keep = sequential_keep_mask(scaled, Truncation(2, top_p, 0.0, "sequential"))
    assert keep[0].nonzero()[:, 0].tolist() == [0, 1, 2, 3]  # by value: three tie at the 2nd
    assert keep[1].nonzero()[:, 0].tolist() == [7, 8, 9]
    assert int(keep_mask(scaled, [Truncation(2, top_p)] * 2).sum()) == 4  # the built-in server's: k by rank


@pytest.mark.parametrize("top_k,top_p,min_p", [(12, 0.6, 0.02), (-1, 0.8, 0.0)])
def test_replayed_logprob_is_the_renormalised_log_softmax_over_the_kept_set(top_k, top_p, min_p):
    temperature = 0.7
    logits = random_logits(2.5, 7).requires_grad_()
    scaled = logits / temperature
    truncation = Truncation(top_k, top_p, min_p, "sequential")
    keep = sequential_keep_mask(scaled.detach(), truncation)
    # a kept token per row, the way a sampler would have drawn one
    targets = torch.multinomial(keep.double(), 1, generator=torch.Generator().manual_seed(1))[:, 0]
    got = truncated_token_logprobs(scaled, targets, truncation, chunk=40)
    expected, full = [], []
    for row, tok in enumerate(targets.tolist()):
        z = scaled[row].detach().double()
        kept = naive_vllm_keep(z.tolist(), top_k, top_p, min_p)
        support = (
            keep[row]
            if kept is None
            else torch.zeros(VOCAB, dtype=torch.bool).index_fill(0, torch.tensor(sorted(kept)), True)
        )
        expected.append(float(z[tok] - torch.logsumexp(z[support], 0)))
        full.append(float(torch.log_softmax(z, 0)[tok]))
    expected_t = torch.tensor(expected)
    bound = tolerance(torch.float32, VOCAB) * max(1.0, float(expected_t.abs().max()))
    assert float((got.detach().double() - expected_t).abs().max()) <= bound
    assert float((torch.tensor(full) - expected_t).abs().max()) > 100 * bound, "the truncation moved nothing"
    got.sum().backward()  # the replay is what the loss differentiates
    assert torch.isfinite(logits.grad).all() and bool((logits.grad[~keep] == 0).all())


def test_the_rule_follows_server_backend_through_the_experiment_config():
    sampling = ["gconfig.top_k=12", "gconfig.top_p=0.6", "gconfig.min_p=0.02", "gconfig.temperature=0.7"]
    vllm = load_config([*sampling, "server.backend=vllm"], GRPOConfig)
    assert vllm.gconfig.logprob_truncation == Truncation(12, 0.6, 0.02, "sequential")
    for backend in ("builtin", "sglang", "auto"):
        config = load_config([*sampling, f"server.backend={backend}"], GRPOConfig)
        assert config.gconfig.logprob_truncation == Truncation(12, 0.6, 0.02, "joint"), backend
    # outside an experiment, the built-in server's rule
    assert GenerationHyperparameters(top_p=0.6).logprob_truncation == Truncation(-1, 0.6, 0.0, "joint")
    # greedy on vLLM: its processed logprobs are the untruncated log-softmax at T = 1, as the trainer's
    greedy = load_config(["gconfig.temperature=0", "gconfig.top_k=5", "server.backend=vllm"], GRPOConfig)
    assert greedy.gconfig.logprob_truncation is None and greedy.gconfig.logprob_temperature == 1.0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["server.backend=vllm", "gconfig.truncation_rule=joint"], "gconfig.truncation_rule='joint' is not how"),
        (["server.backend=builtin", "gconfig.truncation_rule=sequential"], "gconfig.truncation_rule='sequential'"),
        (["gconfig.truncation_rule=nested"], "gconfig.truncation_rule='nested' is not supported"),
        (["server.backend=vllm", "gconfig.temperature=0.005"], "gconfig.temperature=0.005 is raised to 0.01"),
        (
            ["server.backend=vllm", "gconfig.top_p=0.9", "gconfig.truncated_logprobs=false"],
            "gconfig.truncated_logprobs=false with top_p",
        ),
    ],
)
def test_settings_vllm_would_not_match_fail_naming_the_fix(overrides, message):
    """Checked right after the config loads: by the config itself, or by its backend's refusals."""
    from arealite import backends

    with pytest.raises(ConfigError) as info:
        backends.check(load_config(overrides, GRPOConfig))
    assert str(info.value).startswith(message), str(info.value)


def test_an_explicit_rule_matching_the_backend_is_kept():
    config = GRPOConfig(
        gconfig=GenerationHyperparameters(truncation_rule="sequential", top_k=3), server=ServerConfig(backend="vllm")
    )
    assert config.gconfig.logprob_truncation == Truncation(3, 1.0, 0.0, "sequential")
    with pytest.raises(ValueError, match="Truncation.rule='x'"):
        Truncation(rule="x")


def test_the_rules_are_declared_once():
    import typing

    from arealite.config.generation import TruncationRule

    assert typing.get_args(TruncationRule) == TRUNCATION_RULES


@pytest.mark.timeout(120)
def test_the_actor_replays_vllms_rule_when_server_backend_is_vllm(tiny_model_dir, tmp_path):
    """`server.backend=vllm`, set where the user sets it, reaches the trainer's logprobs: on
    tokens drawn from vLLM's kept sets (the least likely kept token each step, the edge where
    the rules part), they equal the naive rule's on the model's own logits."""
    from transformers import AutoModelForCausalLM

    from arealite.config import OptimizerConfig, PPOActorConfig
    from arealite.train.actor import PPOActor
    from tests.server.conftest import make_peaky_model
    from tests.train.server_utils import batch_from_rows

    model_dir = make_peaky_model(tiny_model_dir, str(tmp_path / "peaky"), scale=4.0)
    knobs = {"temperature": 0.8, "top_k": 12, "top_p": 0.6, "min_p": 0.02}
    sampling = [f"gconfig.{k}={v}" for k, v in knobs.items()]
    config = load_config([*sampling, "gconfig.group_size=1", "server.backend=vllm"], GRPOConfig)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows, expected = [], []
    for prompt in ([5, 17, 42, 99], [300, 12, 7]):
        seq = list(prompt)
        for _ in range(6):
            with torch.no_grad():
                z = (model(torch.tensor([seq])).logits[0, -1].double() / knobs["temperature"]).tolist()
            kept = naive_vllm_keep(z, knobs["top_k"], knobs["top_p"], knobs["min_p"])
            assert kept is not None, "a step decided by rounding: pick other prompts"
            tok = min(kept, key=lambda i: z[i])
            expected.append(z[tok] - max(z) - math.log(sum(math.exp(z[i] - max(z)) for i in kept)))
            seq.append(tok)
        rows.append((prompt, seq[len(prompt) :], [0.0] * 6))
    actor_config = PPOActorConfig(path=model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-3))
    actor = PPOActor(actor_config, config.gconfig).initialize()
    batch = batch_from_rows(rows)
    got = actor.compute_logp(batch)[batch["loss_mask"].bool()].double()
    expected_t = torch.tensor(expected, dtype=torch.float64)
    bound = tolerance(torch.float32, 64) * max(1.0, float(expected_t.abs().max()))  # 64: the model's width
    assert float((got - expected_t).abs().max()) <= bound
    actor.gconfig = GenerationHyperparameters(group_size=1, **knobs)  # the built-in server's rule
    joint = actor.compute_logp(batch)[batch["loss_mask"].bool()].double()
    assert float((joint - expected_t).abs().max()) > 100 * bound, "the case cannot tell the two rules apart"

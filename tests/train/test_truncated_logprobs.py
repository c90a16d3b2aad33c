"""Exact behaviour logprobs under truncated sampling (top-k / top-p / min-p / temperature).

A built-in server on loopback samples with `processed_logprobs: true`; the logprob it reports
for every sampled token must equal (1) a naive reference: the model's fp32 logits, the kept
set picked token by token in Python, and the logprob renormalised over it in float64, and
(2) the trainer's `compute_logp` under the same `gconfig`. The bound is fp32 rounding through
the model's 64-long dot products, relative to the largest |logprob|; the truncation moves the
logprobs by far more than that, which the test checks too, so a server or trainer that
ignored it would fail.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from arealite.config import GenerationHyperparameters, OptimizerConfig, PPOActorConfig
from arealite.server.process import launch_server_process
from arealite.train.actor import PPOActor
from tests.server.conftest import make_peaky_model
from tests.tolerance import tolerance
from tests.train.server_utils import batch_from_results

HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
PROMPTS = [[5, 17, 42, 99], [300, 12], [7, 8, 9, 10, 11, 12]]
CASES = [  # (temperature, top_p, top_k, min_p)
    (1.0, 1.0, 1, 0.0),
    (0.7, 0.8, -1, 0.0),
    (1.3, 1.0, 5, 0.05),
    (1.0, 0.9, 8, 0.02),
]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> str:
    # Peaked distributions (lm_head x 4), so top-p and min-p cut a few tokens, not all but one.
    return make_peaky_model(tiny_model_dir, str(tmp_path_factory.mktemp("peaky4")), scale=4.0)


@pytest.fixture(scope="module")
def server(model_dir):
    args = ["--dtype", "float32", "--torch-threads", "1", "--skip-server-warmup", "--random-seed", "3"]
    proc = launch_server_process(model_dir, extra_args=args)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def actor(model_dir):
    config = PPOActorConfig(path=model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-3))
    return PPOActor(config, GenerationHyperparameters(group_size=1)).initialize()


def naive_truncated_logprob(logits: list[float], token: int, temperature: float, top_p, top_k, min_p) -> float:
    """log p(token) under softmax(logits / T) cut by top-k, top-p, min-p and renormalised (float64)."""
    z = [x / temperature for x in logits]
    top = max(z)
    probs = [math.exp(v - top) for v in z]
    total = sum(probs)
    probs = [p / total for p in probs]
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = [], 0.0
    for rank, i in enumerate(order):
        if (top_k > 0 and rank >= top_k) or (rank > 0 and mass >= top_p):
            break
        kept.append(i)
        mass += probs[i]
    kept = [i for i in kept if probs[i] >= min_p * probs[order[0]]]
    assert token in kept, f"sampled token {token} is outside the kept set {kept}"
    return z[token] - top - math.log(sum(math.exp(z[i] - top) for i in kept))


def _generate(server, params: dict) -> list[dict]:
    out = []
    for seed, ids in enumerate(PROMPTS):
        body = {
            "input_ids": ids,
            "sampling_params": {**params, "max_new_tokens": 12, "ignore_eos": True, "sampling_seed": seed},
            "return_logprob": True,
            "processed_logprobs": True,
        }
        status, reply = server.post("/generate", body, timeout=120)
        assert status == 200, reply
        assert reply["meta_info"].get("processed_logprobs") is True
        out.append(reply)
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("temperature,top_p,top_k,min_p", CASES)
def test_server_and_trainer_report_the_truncated_renormalised_logprob(
    server, actor, model_dir, temperature, top_p, top_k, min_p
):
    params = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    results = _generate(server, params)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    naive, full, reported = [], [], []
    for ids, res in zip(PROMPTS, results):
        triples = res["meta_info"]["output_token_logprobs"]
        seq = ids + [t[1] for t in triples]
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0].double()
        for j, (lp, tok, _) in enumerate(triples):
            row = logits[len(ids) + j - 1]
            naive.append(naive_truncated_logprob(row.tolist(), tok, temperature, top_p, top_k, min_p))
            full.append(float(torch.log_softmax(row / temperature, -1)[tok]))
            reported.append(lp)
    naive_t, reported_t = torch.tensor(naive), torch.tensor(reported, dtype=torch.float64)
    bound = tolerance(torch.float32, HIDDEN) * max(1.0, float(naive_t.abs().max()))

    actor.gconfig = GenerationHyperparameters(
        group_size=1, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p
    )
    batch = batch_from_results(PROMPTS, results)
    trainer = actor.compute_logp(batch)[batch["loss_mask"].bool()].double()

    server_err = float((reported_t - naive_t).abs().max())
    trainer_err = float((trainer - naive_t).abs().max())
    cut = float((torch.tensor(full) - naive_t).abs().max())
    print(
        f"{params}: max |server - naive| = {server_err:.2e}, max |trainer - naive| = {trainer_err:.2e}, "
        f"bound {bound:.1e}; truncation moves logprobs by up to {cut:.2f}"
    )
    assert server_err <= bound
    assert trainer_err <= bound
    assert cut > 100 * bound, "nothing was truncated: the case does not test truncation"
    if top_k == 1 and temperature == 1.0:
        assert all(v == 0.0 for v in reported) and bool((trainer == 0).all())


@pytest.mark.timeout(240)
def test_bf16_server_and_trainer_agree_on_truncated_logprobs(model_dir) -> None:
    """bf16 on both sides, measured: the gap between the server's and the trainer's truncated
    logprobs is bf16 rounding (a kept set can differ at its edge), far below what the truncation
    itself moves. The bound on the mean is one bf16 epsilon relative to the largest |logprob|:
    each side rounds its logits once to bf16 (the server's and the trainer's kernels differ)."""
    temperature, top_p, top_k, min_p = 1.0, 0.9, 8, 0.02
    params = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    args = ["--dtype", "bfloat16", "--torch-threads", "1", "--skip-server-warmup", "--random-seed", "3"]
    proc = launch_server_process(model_dir, extra_args=args)
    try:
        results = _generate(proc, params)
    finally:
        proc.stop()
    config = PPOActorConfig(path=model_dir, dtype="bfloat16", optimizer=OptimizerConfig(lr=1e-3))
    gconfig = GenerationHyperparameters(group_size=1, **params)
    actor = PPOActor(config, gconfig).initialize()
    batch = batch_from_results(PROMPTS, results)
    mask = batch["loss_mask"].bool()
    trainer = actor.compute_logp(batch)[mask].double()
    actor.gconfig = GenerationHyperparameters(group_size=1, temperature=temperature)
    untruncated = actor.compute_logp(batch)[mask].double()
    triples = [t for r in results for t in r["meta_info"]["output_token_logprobs"]]
    reported = torch.tensor([t[0] for t in triples], dtype=torch.float64)
    gap = (reported - trainer).abs()
    cut = (untruncated - trainer).abs()
    bound = tolerance(torch.bfloat16, 1, k=1.0) * max(1.0, float(trainer.abs().max()))
    print(
        f"bf16 {params}: |server - trainer| mean {float(gap.mean()):.2e}, max {float(gap.max()):.2e} "
        f"over {gap.numel()} tokens (bound on the mean {bound:.1e}); "
        f"truncation moves logprobs by {float(cut.mean()):.2f} on average, up to {float(cut.max()):.2f}"
    )
    assert float(gap.mean()) <= bound
    assert float(cut.mean()) > 2 * bound, "a trainer that ignored the truncation would pass: the case tests nothing"

"""Exact behaviour logprobs on vLLM: the logprob a real vLLM server reports for every token it
samples (`--logprobs-mode processed_logprobs`) equals the trainer's recomputation at the same
weights, with top-k, top-p and min-p each on, combined, untruncated, and greedy.

The trainer is `PPOActor.compute_logp` under the `gconfig` of an experiment config with
`server.backend=vllm`, so the test goes through the setting the user writes. Every case is
sent at once, so vLLM batches rows with different knobs (greedy rows among sampled ones)
as it would in a run. The bound is the vLLM tests' `LOGPROB_BOUND_SHORT` (tests/vllm/conftest.py,
from benchmarks/vllm_parity.py's measurement at temperature 1) divided by the temperature, which
scales the logits and so their rounding; the truncation moves the logprobs by far more, which
the test checks, so a trainer that ignored vLLM's rule would fail. The measured differences
are printed (`-s`).
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from arealite.config import GenerationHyperparameters, GRPOConfig, OptimizerConfig, PPOActorConfig, load_config
from tests.tolerance import tolerance
from tests.train.server_utils import batch_from_rows
from tests.vllm.conftest import LOGPROB_BOUND_SHORT

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]

HIDDEN = 128  # the served tiny model's width: the longest dot product behind a logit
PROMPTS = [[5, 17, 42, 99], [7, 8, 9, 10, 11, 12]]
NEW_TOKENS = 12
CASES = {  # name: (temperature, top_k, top_p, min_p); the tiny model's logits are flat: T sharpens them
    "top_k": (0.2, 8, 1.0, 0.0),
    "top_p": (0.2, -1, 0.6, 0.0),
    "min_p": (0.2, -1, 1.0, 0.3),
    "top_k+top_p": (0.25, 12, 0.5, 0.0),
    "all three": (0.2, 16, 0.6, 0.1),
    "untruncated": (0.7, -1, 1.0, 0.0),
    "greedy": (0.0, 8, 0.6, 0.1),  # vLLM ignores the knobs and reports log_softmax at T = 1
}


def _generate(address: str, prompt: list[int], knobs: tuple, seed: int) -> dict:
    temperature, top_k, top_p, min_p = knobs
    params = {"max_tokens": NEW_TOKENS, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    # seeded, so every run samples the same tokens: an unseeded run may sample a token whose mass lies
    # within rounding of a cut, where the two sides' kept sets may differ (docs/protocol.md §1.6.1)
    params.update(min_p=min_p, logprobs=0, ignore_eos=True, detokenize=False, seed=seed)
    body = json.dumps({"token_ids": prompt, "sampling_params": params}).encode()
    req = urllib.request.Request(f"http://{address}/inference/v1/generate", body, method="POST")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=600) as r:
        choice = json.loads(r.read())["choices"][0]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(logprobs) == len(choice["token_ids"]) == NEW_TOKENS, choice
    return {"tokens": choice["token_ids"], "logprobs": logprobs}


def _gconfig(knobs: tuple) -> GenerationHyperparameters:
    temperature, top_k, top_p, min_p = knobs
    overrides = [f"gconfig.temperature={temperature}", f"gconfig.top_k={top_k}", f"gconfig.top_p={top_p}"]
    overrides += [f"gconfig.min_p={min_p}", "gconfig.group_size=1", "server.backend=vllm"]
    return load_config(overrides, GRPOConfig).gconfig


@pytest.fixture(scope="module")
def actor(vllm_server):
    from arealite.train.actor import PPOActor

    config = PPOActorConfig(path=vllm_server.model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-3))
    with PPOActor(config, GenerationHyperparameters(group_size=1)) as actor:
        yield actor


def test_vllm_and_trainer_logprobs_agree_token_for_token(vllm_server, actor):
    jobs = [(name, i) for name in CASES for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = dict(
            zip(
                jobs,
                pool.map(lambda j: _generate(vllm_server.address, PROMPTS[j[1]], CASES[j[0]], 1 + jobs.index(j)), jobs),
            )
        )
    failures = []
    for name, knobs in CASES.items():
        rows = [(p, replies[name, i]["tokens"], replies[name, i]["logprobs"]) for i, p in enumerate(PROMPTS)]
        batch = batch_from_rows(rows)
        mask = batch["loss_mask"].bool()
        server = batch["logprobs"][mask].double()
        actor.gconfig = _gconfig(knobs)
        trainer = actor.compute_logp(batch)[mask].double()
        actor.gconfig = GenerationHyperparameters(group_size=1, temperature=knobs[0] or 1.0)
        untruncated = actor.compute_logp(batch)[mask].double()
        temperature, top_k, top_p, min_p = knobs[0] or 1.0, *knobs[1:]
        # the built-in server's (joint) rule on the same tokens, for the record
        actor.gconfig = GenerationHyperparameters(1, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        joint = actor.compute_logp(batch)[mask].double()
        bound = LOGPROB_BOUND_SHORT / temperature  # greedy: temperature 1
        # fp32 rounding relative to the largest |scaled logit|: what truncation must move the logprobs beyond
        rounding = tolerance(torch.float32, HIDDEN) * max(1.0, float(untruncated.abs().max()))
        gap = float((server - trainer).abs().max())
        cut = float((untruncated - trainer).abs().max())
        by_joint = float((joint - server).abs().max())
        print(
            f"{name} {knobs}: max |vLLM - trainer| = {gap:.2e} over {server.numel()} tokens (bound {bound:.1e}); "
            f"truncation moves logprobs by up to {cut:.3f}; the joint rule would be off by up to {by_joint:.3f}"
        )
        if gap > bound:
            failures.append(f"{name}: {gap:.2e} > {bound:.1e}")
        truncating = knobs[0] > 0 and (knobs[1] > 0 or knobs[2] < 1 or knobs[3] > 0)
        if truncating and cut <= 100 * rounding:
            failures.append(f"{name}: nothing was truncated, the case tests nothing")
        if not truncating and cut > bound:
            failures.append(f"{name}: the trainer truncated an untruncated case ({cut:.2e})")
    assert not failures, failures


def test_min_new_tokens_ban_through_the_client_is_replayed_by_the_trainer(vllm_server, actor):
    """`gconfig.min_new_tokens` (with extra `stop_token_ids`) through `RemoteVLLMEngine`: vLLM samples
    the first answer tokens without its stop tokens (the model's EOS and the stop ids) and reports
    that distribution's processed logprobs; the client marks those tokens and `PPOActor.compute_logp`
    under the same gconfig (an experiment config's, truncating) replays the ban, within the vLLM
    tests' bound. A third of the vocabulary as stop ids makes the ban move each banned logprob far
    beyond it, so a trainer ignoring it fails."""
    import uuid

    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteVLLMEngine
    from arealite.rollout.batch import trajectory_from_tokens
    from arealite.types import ModelRequest

    stop_ids = ",".join(map(str, range(100, 280)))
    overrides = ["gconfig.max_new_tokens=14", "gconfig.min_new_tokens=10", f"gconfig.stop_token_ids=[{stop_ids}]"]
    # the tiny model's logits are flat at temperature 1: top-p cuts a tail, the EOS stays in it
    overrides += ["gconfig.temperature=1.0", "gconfig.top_p=0.95", "gconfig.sampling_seed=5"]
    gconfig = load_config([*overrides, "gconfig.group_size=1", "server.backend=vllm"], GRPOConfig).gconfig
    engine = RemoteVLLMEngine(InferenceEngineConfig(setup_timeout=60.0, request_timeout=300.0), [vllm_server.address])
    engine.initialize()
    try:
        resps = [
            engine.loop.run(engine.agenerate(ModelRequest(rid=uuid.uuid4().hex, input_ids=p, gconfig=gconfig)))
            for p in PROMPTS
        ]
    finally:
        engine.destroy()
    assert all(r.output_len >= 10 and r.output_stop_banned == [i < 10 for i in range(r.output_len)] for r in resps)
    batch = trajectory_from_tokens(
        [r.input_tokens for r in resps], [r.output_tokens for r in resps], [r.output_logprobs for r in resps],
        [r.output_versions for r in resps], output_stop_banned=[r.output_stop_banned for r in resps],
    )  # fmt: skip
    mask = batch["loss_mask"].bool()
    actor.gconfig = gconfig
    try:
        gap = float((actor.compute_logp(batch) - batch["logprobs"])[mask].abs().max())
        plain = {k: v for k, v in batch.items() if k != "stop_banned"}
        ignored = float((actor.compute_logp(plain) - batch["logprobs"])[mask].abs().max())
    finally:
        actor.gconfig = GenerationHyperparameters(group_size=1)
    bound = LOGPROB_BOUND_SHORT / gconfig.temperature
    print(f"min_new_tokens: max |vLLM - trainer| {gap:.2e} (bound {bound:.1e}); the ban not replayed: {ignored:.2e}")
    assert gap <= bound
    assert ignored > 100 * bound


VLLM_MASKS = """
import sys, types, torch
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
logits, cases = torch.load(sys.argv[1])
masks = []
for top_k, top_p, min_p in cases:
    x, rows, vocab = logits.clone(), logits.shape[0], logits.shape[1]
    if min_p > 0:  # the processor's own apply, on a stand-in for its batch state
        state = types.SimpleNamespace(min_p_count=rows, min_p=torch.full((rows, 1), min_p))
        x = MinPLogitsProcessor.apply(state, x)
    k = torch.full((rows,), top_k, dtype=torch.int32) if 0 < top_k < vocab else None
    p = torch.full((rows,), top_p) if top_p < 1 else None
    masks.append(apply_top_k_top_p(x, k, p) != float("-inf"))
torch.save(masks, sys.argv[2])
"""


@pytest.mark.heavy  # importing vLLM takes about a minute on a busy 2-core machine
def test_the_replay_keeps_what_vllms_own_sampler_functions_keep(vllm_server, tmp_path):
    """The rule against vLLM's code itself (its min-p processor and top-k/top-p function, run in
    vLLM's environment) on random fp32 logits, flat to peaked: the same kept set, row for row.
    A guard against the rule drifting in a later vLLM, at the cuts' edges included."""
    import subprocess

    from arealite.algo.truncation import Truncation, sequential_keep_mask

    gen = torch.Generator().manual_seed(0)
    logits = torch.cat([torch.randn(128, 512, generator=gen) * s for s in (0.5, 2.0, 6.0)])
    cases = [(6, 1.0, 0.0), (-1, 0.8, 0.0), (-1, 1.0, 0.05), (12, 0.6, 0.02), (40, 0.9, 0.0), (-1, 0.7, 0.1)]
    torch.save((logits, cases), tmp_path / "in.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # vLLM's environment, not ours
    run = [vllm_server.python, "-c", VLLM_MASKS, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case, theirs in zip(cases, torch.load(tmp_path / "out.pt")):
        ours = sequential_keep_mask(logits, Truncation(*case, rule="sequential"))
        rows = int((ours != theirs).any(-1).sum())
        assert rows == 0, f"{case}: {rows} of {logits.shape[0]} rows keep other tokens than vLLM's sampler"

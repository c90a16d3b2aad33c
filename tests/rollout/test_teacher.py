"""The distillation teacher's client against real built-in servers: its logprobs are a plain
forward's, batches spread over the servers and survive one dying, and a teacher with another
tokenizer is refused at start, naming both."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.config import DistillConfig, GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.teacher import PROBE_TEXT, TeacherClient
from arealite.tools.tiny_model import build_tiny_model
from tests.tolerance import tolerance

from .conftest import kill, start_servers

pytestmark = pytest.mark.timeout(300)
TEMPERATURE = 0.8  # not 1: the teacher must score at the student's sampling temperature
FAILURE = InferenceEngineConfig(setup_timeout=60, health_check_interval=0.5, health_check_timeout=5)


def make_batch(rows: list[tuple[list[int], int]]) -> dict[str, torch.Tensor]:
    """Right-padded batch of (tokens, prompt length) rows; the completion is the loss mask."""
    T = max(len(t) for t, _ in rows)
    batch = {k: torch.zeros(len(rows), T, dtype=torch.long) for k in ("input_ids", "attention_mask", "loss_mask")}
    for b, (tokens, prompt) in enumerate(rows):
        batch["input_ids"][b, : len(tokens)] = torch.tensor(tokens)
        batch["attention_mask"][b, : len(tokens)] = 1
        batch["loss_mask"][b, prompt : len(tokens)] = 1
    batch["logprobs"] = torch.randn(len(rows), T) * batch["loss_mask"]
    batch["advantages"] = torch.randn(len(rows), T) * batch["loss_mask"]
    return batch


def reference(model_dir: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log_softmax(logits / T) of every token given its prefix, one plain forward per row; 0 off the mask."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = torch.zeros(batch["input_ids"].shape)
    for b in range(len(out)):
        n = int(batch["attention_mask"][b].sum())
        ids = batch["input_ids"][b, :n]
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids[None]).logits[0, :-1].float() / TEMPERATURE, -1)
        out[b, 1:n] = lp.gather(1, ids[1:, None])[:, 0]
    return out * batch["loss_mask"]


def test_teacher_logprobs_spread_fail_over_and_match_a_plain_forward(tiny_model_dir, tmp_path):
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(7):  # prompts of 3-9 tokens, completions of 1-20
        prompt, completion = 3 + i % 7, 1 + (5 * i) % 20
        rows.append((torch.randint(0, 500, (prompt + completion,), generator=g).tolist(), prompt))
    batch = make_batch(rows)
    expected = reference(tiny_model_dir, batch)
    config = DistillConfig(address="unused:1", max_batch_size=2, kl_coef=0.5, reward_weight=0.25)
    gconfig = GenerationHyperparameters(temperature=TEMPERATURE)
    servers = start_servers(tiny_model_dir, tmp_path, 2)
    try:
        with TeacherClient(config, FAILURE, gconfig, tiny_model_dir, [s.address for s in servers]) as teacher:
            got = teacher.compute_logp(batch)
            bound = tolerance(torch.float32, 64, k=16) * float(expected.abs().max())  # 64: the hidden size
            assert (got - expected).abs().max() <= bound
            assert teacher.stats["teacher_requests"] == 4  # 7 rows, 2 a request
            kill(servers[0])
            assert (teacher.compute_logp(batch) - expected).abs().max() <= bound  # all on the survivor now
            assert teacher.pool.down == [servers[0].address]

            before = batch["advantages"].clone()
            teacher.distill(batch)
            mixed = 0.25 * before + 0.5 * (batch["teacher_logp"] - batch["logprobs"])
            assert torch.equal(batch["advantages"], mixed * batch["loss_mask"])
    finally:
        for s in servers:
            s.stop()


def test_min_new_tokens_is_refused_with_a_teacher():
    """The student's logprobs replay min_new_tokens's stop ban; a teacher's prompt logprobs cannot."""
    with pytest.raises(ValueError, match="gconfig.min_new_tokens=3"):
        TeacherClient(DistillConfig(address="unused:1"), FAILURE, GenerationHyperparameters(min_new_tokens=3), "x")


def test_a_teacher_with_another_tokenizer_is_refused_at_start(tiny_model_dir, tmp_path):
    other = build_tiny_model(str(tmp_path / "other"), seed=1, vocab_size=400)  # its own BPE: other ids
    config = DistillConfig(address="unused:1")
    (server,) = start_servers(tiny_model_dir, tmp_path, 1)
    try:
        teacher = TeacherClient(config, FAILURE, GenerationHyperparameters(), other, [server.address])
        with pytest.raises(ValueError, match="do not share a tokenizer") as refused:
            teacher.initialize()
        assert tiny_model_dir in str(refused.value) and other in str(refused.value)
        assert not teacher._loop.running  # nothing left behind
        # a teacher whose files are elsewhere is checked by how it tokenizes a probe text (the adapter's call)
        path, body = teacher.server.tokenize_call(PROBE_TEXT)
        request = urllib.request.Request(f"http://{server.address}{path}", json.dumps(body).encode(), method="POST")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=60) as reply:
            got = teacher.server.parse_tokenized(json.loads(reply.read()))
        assert got == AutoTokenizer.from_pretrained(tiny_model_dir).encode(PROBE_TEXT) != []
    finally:
        server.stop()

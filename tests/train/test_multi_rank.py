"""Two trainer processes on gloo: same update as one process; distributed weight sync to two
built-in servers after which every server generates exactly what the trainer's model does."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from arealite.server.process import launch_server_process
from arealite.utils.net import free_ports
from tests.tolerance import assert_close, close
from tests.train import dist_worker
from tests.train.helpers import run_ranks
from tests.train.server_utils import batch_from_results, generate

PROMPTS = [[5, 17, 42, 99], [300, 12], [7, 8, 9, 10, 11, 12]]
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
ROUNDING_N = 60 * HIDDEN  # an update sums gradients over the batch's ~60 tokens


@pytest.mark.timeout(400)
def test_one_rank_and_two_ranks_make_the_same_update(tiny_model_dir, tmp_path):
    # the two ranks take the LM head in blocks (head_chunk_tokens=4), the one rank whole: FSDP2
    # reduces the blocks' head gradient like the whole head's
    run_ranks(2, ["update", tiny_model_dir, str(tmp_path / "w2"), "chunked"])
    dist_worker.main(["update", tiny_model_dir, str(tmp_path / "w1")])  # world 1, in this process
    s1 = json.loads((tmp_path / "w1" / "stats.json").read_text())
    s2 = json.loads((tmp_path / "w2" / "stats.json").read_text())
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "loss_weight", "importance_ratio_max"):
        assert close(s1[key], s2[key], n=ROUNDING_N, scale=max(1.0, abs(s1[key]))), key
    w1 = load_file(str(tmp_path / "w1" / "hf" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "w2" / "hf" / "model.safetensors"))
    w0 = load_file(f"{tiny_model_dir}/model.safetensors")
    assert w1.keys() == w2.keys()
    for name in w1:
        assert_close(w2[name], w1[name], n=ROUNDING_N, msg=name)
    assert any(not torch.allclose(w1[n], w0[n]) for n in w1)  # the step did move the weights
    # Re-dealt by tokens (largest first): rank 0 started with 33 tokens and rank 1 with 27.
    shares = [json.loads((tmp_path / "w2" / f"share{r}.json").read_text()) for r in (0, 1)]
    assert sorted(shares[0]["firsts"] + shares[1]["firsts"]) == sorted(json.loads(
        (tmp_path / "w1" / "share0.json").read_text())["firsts"])  # fmt: skip
    assert sorted(s["tokens"] for s in shares) == [29, 31]


@pytest.mark.timeout(400)
def test_uneven_ranks_with_filler_micro_batches_make_the_same_update(tiny_model_dir, tmp_path):
    # 2 vs 6 sequences, 3 micro-batches each; the 2 ranks take prox_logp from the update's own
    # forward (fillers included), the single rank from an explicit compute_logp pass.
    run_ranks(2, ["uneven", tiny_model_dir, str(tmp_path / "w2"), "fused"])
    dist_worker.main(["uneven", tiny_model_dir, str(tmp_path / "w1")])
    s1 = json.loads((tmp_path / "w1" / "stats.json").read_text())
    s2 = json.loads((tmp_path / "w2" / "stats.json").read_text())
    assert close(s1["loss"], s2["loss"], n=ROUNDING_N) and s1["loss_weight"] == s2["loss_weight"]
    for key in ("pg_loss", "importance_ratio", "behav_imp_weight"):
        assert close(s1[key], s2[key], n=ROUNDING_N, scale=max(1.0, abs(s1[key]))), key
    w1 = load_file(str(tmp_path / "w1" / "hf" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "w2" / "hf" / "model.safetensors"))
    for name in w1:
        assert_close(w2[name], w1[name], n=ROUNDING_N, msg=name)


def _greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    ids, out, lps = list(prompt), [], []
    with torch.no_grad():
        for _ in range(n):
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
            tok = int(logp.argmax())
            ids.append(tok)
            out.append(tok)
            lps.append(float(logp[tok]))
    return out, lps


@pytest.mark.timeout(400)
def test_distributed_weight_sync_two_ranks_two_servers(tiny_model_dir, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        starts = [
            pool.submit(
                launch_server_process, tiny_model_dir, extra_args=["--dtype", "float32", "--skip-server-warmup"]
            )
            for _ in range(2)
        ]
        servers = [f.result() for f in starts]
    try:
        params = {"max_new_tokens": 10, "temperature": 0.0, "ignore_eos": True}
        before = [generate(s, PROMPTS, params) for s in servers]
        addrs = ",".join(s.address for s in servers)
        run_ranks(2, ["sync", tiny_model_dir, str(tmp_path), addrs, str(free_ports(1)[0])])
        after = [generate(s, PROMPTS, params) for s in servers]
    finally:
        for s in servers:
            s.stop()
    buckets = json.loads((tmp_path / "buckets.json").read_text())
    assert len(buckets) >= 1 and all(d == "float32" for b in buckets for _, d, _ in b)
    trained = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    for server_results, server_before in zip(after, before):
        assert all(r["meta_info"]["weight_version"] == "1" for r in server_results)
        batch_after = batch_from_results(PROMPTS, server_results)
        batch_before = batch_from_results(PROMPTS, server_before)
        assert not torch.allclose(batch_after["logprobs"], batch_before["logprobs"], atol=1e-3)  # weights changed
        for prompt, res in zip(PROMPTS, server_results):
            tokens, lps = _greedy(trained, prompt, 10)
            assert res["output_ids"] == tokens
            got = [t[0] for t in res["meta_info"]["output_token_logprobs"]]
            assert_close(torch.tensor(got), torch.tensor(lps), n=HIDDEN)

"""LoRA adapters on the built-in server, through SGLang's endpoints: /load_lora_adapter and
/unload_lora_adapter replies, `lora_path` per sequence in /generate (adapters and the base
model mixed in one batch), logprobs equal to peft's own forward of base + adapter, and
clean 400s for whatever cannot be served."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="building test adapters needs peft: pip install 'arealite[lora]'")

from tests.server.conftest import start_server
from tests.tolerance import tolerance

pytestmark = pytest.mark.timeout(240)
PROMPTS = [[5, 6, 7], [100, 200, 300, 400], [42]]
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
TARGETS = ["q_proj", "v_proj", "down_proj"]


def make_adapter(model_dir: str, out: str, seed: int, rank: int = 4, targets=TARGETS) -> str:
    """A peft adapter folder with random (non-zero) A and B, saved by peft itself."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    model.save_pretrained(out)
    return out


def peft_logprobs(model_dir: str, adapter: str | None, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax at each output token from peft's forward of base (+ adapter) on the whole sequence."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp.gather(1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a": make_adapter(model_dir, str(root / "a"), seed=1),
        "b": make_adapter(model_dir, str(root / "b"), seed=2),
        "rank16": make_adapter(model_dir, str(root / "rank16"), seed=3, rank=16),
        "k_proj": make_adapter(model_dir, str(root / "k_proj"), seed=4, targets=["k_proj"]),
    }


@pytest.fixture(scope="module")
def lora_server(model_dir, tmp_path_factory):
    args = ["--enable-lora", "--max-lora-rank", "8", "--lora-target-modules", *TARGETS, "--dtype", "float32"]
    with start_server(model_dir, tmp_path_factory.mktemp("lora_server_logs"), args) as proc:
        yield proc


def _generate(server, prompts, lora_path=None) -> list[dict]:
    body = {"input_ids": prompts, "sampling_params": {"max_new_tokens": 6, "temperature": 0.0}, "return_logprob": True}
    if lora_path is not None:
        body["lora_path"] = lora_path
    status, results = server.post("/generate", body, timeout=120)
    assert status == 200, results
    return results


def _tokens_and_logprobs(result) -> tuple[list[int], torch.Tensor]:
    triples = result["meta_info"]["output_token_logprobs"]
    return [t[1] for t in triples], torch.tensor([t[0] for t in triples])


def test_load_unload_replies_and_model_list(lora_server, adapters):
    status, body = lora_server.post("/load_lora_adapter", {"lora_name": "a", "lora_path": adapters["a"]})
    assert (status, body) == (200, {"success": True, "error_message": "", "loaded_adapters": {"a": adapters["a"]}})
    status, body = lora_server.post("/load_lora_adapter", {"lora_name": "a", "lora_path": adapters["b"]})
    assert status == 400 and not body["success"] and "already loaded" in body["error_message"]
    for path, why in [
        (adapters["rank16"], "exceeds --max-lora-rank 8"),
        (adapters["k_proj"], "outside --lora-target-modules"),
        ("/no/such/adapter", "is not an adapter directory"),
    ]:
        status, body = lora_server.post("/load_lora_adapter", {"lora_name": "x", "lora_path": path})
        assert status == 400 and why in body["error_message"] and body["loaded_adapters"] == {"a": adapters["a"]}, body
    status, body = lora_server.post("/load_lora_adapter", {"lora_path": adapters["b"]})
    assert status == 400 and "lora_name must be a non-empty string" in body["message"]
    status, models = lora_server.get("/v1/models")
    cards = {card["id"]: card for card in models["data"]}
    assert cards["a"]["parent"] == models["data"][0]["id"] and cards["a"]["root"] == adapters["a"]
    status, body = lora_server.post("/unload_lora_adapter", {"lora_name": "a"})
    assert (status, body["loaded_adapters"]) == (200, {})
    status, body = lora_server.post("/unload_lora_adapter", {"lora_name": "a"})
    assert status == 400 and "LoRA with name a does not exist" in body["error_message"]
    status, body = lora_server.post("/generate", {"input_ids": [1, 2], "lora_path": "a"})
    assert status == 400 and "not loaded: a" in body["error"]["message"]
    status, body = lora_server.post("/generate", {"input_ids": [[1, 2]], "lora_path": ["a", "b"]})
    assert status == 400 and "lora_path has 2 entries but the batch has 1 prompts" in body["error"]["message"]


def test_generation_follows_each_rows_adapter(lora_server, adapters, model_dir):
    for name in ("a", "b"):
        status, body = lora_server.post("/load_lora_adapter", {"lora_name": name, "lora_path": adapters[name]})
        assert status == 200, body
    try:
        alone = {name: _generate(lora_server, PROMPTS, name) for name in ("a", "b")}
        alone[None] = _generate(lora_server, PROMPTS)
        mixed = _generate(lora_server, PROMPTS, ["a", None, "b"])  # one batch, three kinds of rows
        for i, name in enumerate(["a", None, "b"]):
            tokens, logprobs = _tokens_and_logprobs(mixed[i])
            want_tokens, want = _tokens_and_logprobs(alone[name][i])
            assert tokens == want_tokens
            bound = tolerance(torch.float32, HIDDEN) * float(want.abs().max())
            assert float((logprobs - want).abs().max()) <= bound
        for name in ("a", None):  # what peft computes for base (+ adapter)
            tokens, logprobs = _tokens_and_logprobs(alone[name][1])
            ref = peft_logprobs(model_dir, adapters.get(name), PROMPTS[1], tokens)
            assert float((logprobs - ref).abs().max()) <= tolerance(torch.float32, HIDDEN) * float(ref.abs().max())
        assert _tokens_and_logprobs(alone["a"][1])[0] != _tokens_and_logprobs(alone[None][1])[0]  # the adapter matters
    finally:
        for name in ("a", "b"):
            lora_server.post("/unload_lora_adapter", {"lora_name": name})


def test_a_server_without_enable_lora_refuses_adapters(server, adapters):
    status, body = server.post("/load_lora_adapter", {"lora_name": "a", "lora_path": adapters["a"]})
    assert status == 400 and "--enable-lora" in body["error_message"]
    status, body = server.post("/generate", {"input_ids": [1, 2], "lora_path": "a"})
    assert status == 400 and "LoRA is not enabled" in body["error"]["message"]
    status, body = server.post(
        "/generate", {"input_ids": [1, 2], "lora_path": None, "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 200, body  # null: the base model, as in SGLang

"""Adapter-only weight sync (weight_update=lora) to a built-in server started with
--enable-lora: after LoRA training steps and a sync, what the server samples through the
rollout client carries logprobs equal to the trainer's recomputation (fp32 rounding through
the model's dot products) and clearly unlike the base model's; a second sync replaces the
adapter and prunes old folders."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'arealite[lora]'")

from arealite.config import (
    GenerationHyperparameters,
    InferenceEngineConfig,
    LoRAConfig,
    OptimizerConfig,
    PPOActorConfig,
)
from arealite.rollout import RemoteSGLangEngine
from arealite.server.process import launch_server_process
from arealite.train.actor import PPOActor
from arealite.types import ModelRequest
from arealite.weight_sync import WeightSync
from tests.tolerance import tolerance
from tests.train.helpers import make_batch

torch.set_num_threads(2)
PROMPTS = [[5, 17, 42, 99], [300, 12], [7, 8, 9, 10, 11, 12], [250]]
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
pytestmark = pytest.mark.timeout(240)


def _train(actor: PPOActor, seed: int) -> None:
    """Two PPO updates at lr 3e-2 on a fixed batch: the adapter moves far from zero."""
    for step in range(2):
        batch = make_batch([9, 7, 8, 6], seed=seed + step)
        batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0])
        batch["logprobs"] = actor.compute_logp(batch)
        actor.compute_advantages(batch)
        actor.ppo_update(batch)


def _sample(rollout: RemoteSGLangEngine) -> dict:
    """One sample per prompt through the rollout client, as a padded batch with its versions."""
    gconfig = GenerationHyperparameters(max_new_tokens=12, temperature=1.0, stop_token_ids=[], sampling_seed=7)
    responses = [rollout.loop.run(rollout.agenerate(ModelRequest(input_ids=p, gconfig=gconfig))) for p in PROMPTS]
    T = max(r.input_len + r.output_len for r in responses)
    batch = {
        k: torch.zeros(len(PROMPTS), T, dtype=torch.long)
        for k in ("input_ids", "attention_mask", "loss_mask", "versions")
    }
    batch["logprobs"] = torch.zeros(len(PROMPTS), T)
    for b, r in enumerate(responses):
        n, p = r.input_len + r.output_len, r.input_len
        batch["input_ids"][b, :n] = torch.tensor(r.input_tokens + r.output_tokens)
        batch["attention_mask"][b, :n] = 1
        batch["loss_mask"][b, p:n] = 1
        batch["logprobs"][b, p:n] = torch.tensor(r.output_logprobs)
        batch["versions"][b, p:n] = torch.tensor(r.output_versions)
    batch["rewards"] = torch.zeros(len(PROMPTS))
    return batch


def _base_logprobs(server, batch: dict) -> torch.Tensor:
    """The base model's logprobs of the same tokens (the server's prompt logprobs, no lora_path)."""
    out = torch.zeros_like(batch["logprobs"])
    for b in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][b].sum())
        start = int(batch["loss_mask"][b].argmax())
        status, body = server.post("/generate", {
            "input_ids": batch["input_ids"][b, :n].tolist(), "sampling_params": {"max_new_tokens": 1},
            "return_logprob": True, "logprob_start_len": start,
        })  # fmt: skip
        assert status == 200, body
        out[b, start:n] = torch.tensor([t[0] for t in body["meta_info"]["input_token_logprobs"]])
    return out


def _mean_abs(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask].abs().mean())


def sync_and_compare(tiny_model_dir: str, run_dir, dtype: str) -> list[dict]:
    """Train LoRA, sync it (twice) to a fresh --enable-lora server in `dtype`, and compare:
    per version, the mean |logprob| difference of the trainer and of the base model against
    what the server sampled with the adapter, plus the trainer's largest |logit|."""
    lora = LoRAConfig(
        rank=4, alpha=16.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    args = ["--dtype", dtype, "--torch-threads", "1", "--skip-server-warmup", "--enable-lora", "--max-lora-rank", "4"]
    server = launch_server_process(tiny_model_dir, extra_args=args)
    rollout = RemoteSGLangEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120), [server.address])
    found = []
    try:
        rollout.initialize()
        config = PPOActorConfig(path=tiny_model_dir, dtype=dtype, optimizer=OptimizerConfig(lr=3e-2), lora=lora)
        actor = PPOActor(config, GenerationHyperparameters(group_size=2)).initialize()
        weight_sync = WeightSync(actor, rollout, "lora", str(run_dir), keep_versions=1)
        for version in (1, 2):
            _train(actor, seed=10 * version)
            weight_sync.sync(version)
            assert rollout.lora_adapter == f"arealite-lora-v{version}"
            status, models = server.get("/v1/models")
            assert [c["id"] for c in models["data"][1:]] == [f"arealite-lora-v{version}"]  # the old one was unloaded
            assert sorted(p.name for p in (run_dir / "weights").iterdir()) == [f"v{version}"]

            batch = _sample(rollout)
            mask = batch["loss_mask"].bool()
            assert (batch["versions"][mask] == version).all()
            found.append({
                "trainer": _mean_abs(actor.compute_logp(batch).float(), batch["logprobs"], mask),
                "base": _mean_abs(_base_logprobs(server, batch), batch["logprobs"], mask),
                "mean_logprob": float(batch["logprobs"][mask].abs().mean()),
                "max_logit": float(actor.forward(batch).float()[batch["attention_mask"].bool()].abs().max()),
            })  # fmt: skip
        # a server that comes back gets the newest adapter again (here: one that still has it)
        assert rollout.loop.run(rollout.weights.aresync(server.address))
        status, models = server.get("/v1/models")
        assert [c["id"] for c in models["data"][1:]] == ["arealite-lora-v2"]
        assert server.get("/get_model_info")[1]["weight_version"] == "2"
    finally:
        rollout.destroy()
        server.stop()
    return found


def test_served_logprobs_follow_the_synced_adapter(tiny_model_dir, tmp_path):
    for version, f in enumerate(sync_and_compare(tiny_model_dir, tmp_path, "float32"), 1):
        bound = tolerance(torch.float32, HIDDEN) * f["mean_logprob"]  # fp32 rounding through 64-long dot products
        print(
            f"version {version}: trainer vs server {f['trainer']:.2e} (bound {bound:.2e}); base model vs server "
            f"{f['base']:.2e}"
        )
        assert f["trainer"] <= bound, f"trainer vs server mean |logprob diff| {f['trainer']} > {bound}"
        assert f["base"] > 100 * bound, (
            f"the served logprobs are the base model's ({f['base']}): the adapter was not applied"
        )

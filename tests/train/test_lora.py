"""LoRA on the FSDP2 engine: only the adapter trains and sits in the optimizer, the saved
adapter is a peft folder that peft itself loads to the same logits, and checkpoints hold the
adapter and its optimizer state (frozen weights left out) and resume exactly."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'arealite[lora]'")

from arealite.algo.losses import token_mean
from arealite.config import (
    ConfigError,
    GRPOConfig,
    LoRAConfig,
    OptimizerConfig,
    PPOCriticConfig,
    TrainEngineConfig,
    load_config,
)
from arealite.train.engine import FSDPEngine
from arealite.train.logprobs import packed_token_logprobs
from tests.tolerance import assert_close
from tests.train.helpers import make_batch

torch.set_num_threads(2)
HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit
LORA = LoRAConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def _loss(logits, mb):
    lp = packed_token_logprobs(logits, mb["input_ids"], mb["cu_seqlens"])
    return token_mean(-lp, mb["loss_mask"].bool(), mb["cu_seqlens"]), {}


def _weight(mb):
    return float(mb["loss_mask"].sum())


def _engine(path: str, lr: float = 1e-2, **kw) -> FSDPEngine:
    cfg = TrainEngineConfig(path=path, dtype="float32", optimizer=OptimizerConfig(lr=lr, **kw), lora=LORA)
    return FSDPEngine(cfg, total_optimizer_steps=4).initialize()


def _full(model) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().clone() for n, p in model.named_parameters()}


def test_only_the_adapter_trains_and_saves_as_a_peft_folder(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    engine = _engine(tiny_model_dir)
    adapter = {n for n, p in engine.model.named_parameters() if ".lora_A." in n or ".lora_B." in n}
    assert len(adapter) == 2 * 3 * engine.hf_config.num_hidden_layers  # A and B on 3 layer kinds
    in_optimizer = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(p) for n, p in engine.model.named_parameters() if n in adapter}
    before = _full(engine.model)
    batch = make_batch([9, 7, 8, 6], seed=3)
    for _ in range(2):
        engine.train_batch(batch, _loss, _weight)
    after = _full(engine.model)
    assert {
        n for n in before if not torch.equal(before[n], after[n])
    } == adapter  # every adapter matrix moved, nothing else

    engine.save(str(tmp_path / "adapter"))
    assert sorted(os.listdir(tmp_path / "adapter")) == ["adapter_config.json", "adapter_model.safetensors"]
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (saved["r"], saved["lora_alpha"], sorted(saved["target_modules"])) == (4, 8.0, sorted(LORA.target_modules))
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), str(tmp_path / "adapter")
    )
    logits = engine.forward(batch)
    for b, n in enumerate(batch["attention_mask"].sum(-1).tolist()):
        assert_close(logits[b, :n], peft_model(input_ids=batch["input_ids"][b : b + 1, :n]).logits[0], n=HIDDEN)

    fresh = _engine(tiny_model_dir)  # load() takes the adapter back into a new engine
    fresh.load(str(tmp_path / "adapter"))
    assert_close(fresh.forward(batch), logits, n=HIDDEN)


def test_checkpoint_holds_adapter_and_optimizer_and_resumes_exactly(tiny_model_dir, tmp_path):
    import torch.distributed.checkpoint as dcp

    batch = make_batch([9, 6, 7], seed=17)
    engine = _engine(tiny_model_dir, lr_scheduler_type="linear")
    engine.train_batch(batch, _loss, _weight)
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    keys = set(dcp.FileSystemReader(str(tmp_path / "ckpt")).read_metadata().state_dict_metadata)
    model_keys = {k.removeprefix("model.") for k in keys if k.startswith("model.")}
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)  # no frozen base weight
    assert any(k.startswith("optimizer.state.") and k.endswith("exp_avg_sq") for k in keys)
    engine.train_batch(batch, _loss, _weight)
    want = engine.forward(batch)

    resumed = _engine(tiny_model_dir, lr_scheduler_type="linear")
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    resumed.train_batch(batch, _loss, _weight)  # matches only with the restored Adam moments and lr
    assert_close(resumed.forward(batch), want, n=HIDDEN)


def test_lora_settings_are_checked(tiny_model_dir):
    with pytest.raises(ValueError, match=r"\['qkv'\].*its linear layers are \[.*'q_proj'"):
        FSDPEngine(
            TrainEngineConfig(path=tiny_model_dir, lora=LoRAConfig(target_modules=["q_proj", "qkv"]))
        ).initialize()
    with pytest.raises(ConfigError, match="actor.lora.rank=0 must be > 0"):
        LoRAConfig(rank=0)
    with pytest.raises(ConfigError, match="set weight_update=lora"):
        load_config(["actor.lora.rank=4"], GRPOConfig)
    with pytest.raises(ConfigError, match="weight_update=lora needs an adapter to sync: set actor.lora"):
        load_config(["weight_update=lora"], GRPOConfig)
    with pytest.raises(ConfigError, match="needs rollout.pause_mode=abort"):
        load_config(["weight_update=lora", "actor.lora.rank=4", "rollout.pause_mode=in_place"], GRPOConfig)
    with pytest.raises(ConfigError, match="critic.lora is not supported"):
        PPOCriticConfig(lora=LoRAConfig())
    with pytest.raises(ConfigError, match="frozen model.*cannot have a LoRA adapter"):
        TrainEngineConfig(optimizer=None, lora=LoRAConfig())
    config = load_config(["weight_update=lora", "actor.lora.rank=4", "actor.lora.target_modules=[q_proj]"], GRPOConfig)
    assert (config.actor.lora.rank, config.actor.lora.target_modules) == (4, ["q_proj"])

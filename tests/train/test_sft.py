"""SFT: masks on completion tokens only, the loss against a padded naive computation, learning,
and a deterministic warm start that skips an existing model."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.config import OptimizerConfig, TrainEngineConfig
from arealite.data.packing import pack
from arealite.train.engine import FSDPEngine
from arealite.train.sft import sft_batch, sft_loss, sft_step
from tests.tolerance import close

HIDDEN = 64  # the tiny model's hidden size: the longest dot product behind a logit

RECORDS = [
    {"messages": [{"role": "user", "content": "3+4="}], "answer": "7"},
    {"messages": [{"role": "user", "content": "12+30="}], "answer": "42"},
    {"prompt": "what is 5+5? ", "completion": "10 apples"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_loss_mask_covers_completion_and_eos_only(tokenizer):
    batch = sft_batch(RECORDS, tokenizer)
    for b, r in enumerate(RECORDS):
        ids = batch["input_ids"][b][batch["loss_mask"][b].bool()].tolist()
        target = r.get("completion", r.get("answer"))
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[:-1]) == target
        n = int(batch["attention_mask"][b].sum())
        assert batch["loss_mask"][b, n:].sum() == 0 and batch["attention_mask"][b, :n].all()


def test_record_without_target_names_the_keys(tokenizer):
    with pytest.raises(KeyError, match="'completion' or 'answer'"):
        sft_batch([{"prompt": "x"}], tokenizer)


def test_loss_equals_padded_naive_nll_and_packing_changes_nothing(tiny_model_dir, tokenizer):
    from arealite.data.packing import select

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = FSDPEngine(TrainEngineConfig(path=tiny_model_dir, dtype="float32", optimizer=None)).initialize()
    batch = sft_batch(RECORDS, tokenizer)
    with torch.no_grad():
        total, count, per_row = 0.0, 0, []
        for b in range(len(RECORDS)):  # naive: padded forward of one row, shifted NLL on loss-mask tokens
            n = int(batch["attention_mask"][b].sum())
            ids = batch["input_ids"][b, :n]
            logp = torch.log_softmax(model(input_ids=ids[None]).logits[0], -1)
            nll = [-float(logp[t - 1, ids[t]]) for t in range(1, n) if batch["loss_mask"][b, t]]
            total, count = total + sum(nll), count + len(nll)
            row = pack(select(batch, [b]))
            loss, _ = sft_loss(model(input_ids=row["input_ids"][None]).logits[0], row)
            per_row.append((float(loss), len(nll)))
            assert close(float(loss), sum(nll) / len(nll), n=HIDDEN)
        # the whole batch packed into one row through the engine's own forward
        packed = pack(batch)
        loss, stats = sft_loss(engine._forward_packed(packed), packed)
    engine.destroy()
    assert close(float(loss), total / count, n=HIDDEN)
    assert 0.0 <= float(stats["token_accuracy"]) <= 1.0


@pytest.mark.timeout(120)
def test_sft_steps_fit_a_batch(tiny_model_dir, tokenizer):
    engine = FSDPEngine(
        TrainEngineConfig(path=tiny_model_dir, dtype="float32", optimizer=OptimizerConfig(lr=3e-3)), 20
    ).initialize()
    batch = sft_batch(RECORDS, tokenizer)
    losses = [sft_step(engine, batch)["loss"] for _ in range(20)]
    engine.destroy()
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.timeout(180)
def test_warm_start_is_deterministic_and_skips_an_existing_model(tmp_path, tiny_model_dir, capsys):
    from arealite.tools.sft_warmstart import main
    from arealite.utils.hf_weights import read_hf_weights

    def run(out: str) -> None:
        argv = [f"sft.base_path={tiny_model_dir}", f"actor.path={out}", "sft.steps=3", "sft.batch_size=8",
                "train_dataset.type=arithmetic", "train_dataset.num_samples=64"]  # fmt: skip
        assert main(argv) == 0

    run(str(tmp_path / "a"))
    run(str(tmp_path / "b"))
    a, b, base = (read_hf_weights(str(tmp_path / p)) for p in ("a", "b", tiny_model_dir))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], base[k]) for k in a)
    assert os.path.isfile(tmp_path / "a" / "tokenizer.json") and not os.path.exists(tmp_path / "a.partial")
    run(str(tmp_path / "a"))
    assert "already holds a model" in capsys.readouterr().out

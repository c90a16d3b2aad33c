"""RolloutDump: a batch written and read back is the same batch, bit for bit; only the newest
`keep_steps` steps stay; a step cut short (no meta.json) is not offered for replay."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoTokenizer

from arealite.replay import RolloutDump, dumped_steps, read_batch, read_meta, read_rows
from arealite.rollout.batch import trajectory_from_tokens


@pytest.fixture(scope="module")
def qwen(shared_data):
    return AutoTokenizer.from_pretrained(str(shared_data / "tokenizers" / "qwen2.5"))


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 1000, (int(n),), generator=g).tolist() for n in torch.randint(2, 6, (4,), generator=g)]
    outputs = [torch.randint(0, 1000, (int(n),), generator=g).tolist() for n in torch.randint(1, 7, (4,), generator=g)]
    logprobs = [(-torch.rand(len(o), generator=g)).tolist() for o in outputs]
    batch = trajectory_from_tokens(prompts, outputs, logprobs, [[3] * len(o) for o in outputs])
    batch["rewards"] = torch.rand(4, generator=g)
    batch["advantages"] = torch.randn(batch["input_ids"].shape, generator=g) * batch["loss_mask"]
    batch["truncated"] = torch.tensor([True, False, False, True])
    batch["group_ids"] = ["not", "a", "tensor", "!"]
    return batch


def test_a_dumped_batch_reads_back_bit_for_bit_with_its_text(tmp_path, qwen):
    batch = _batch(0)
    RolloutDump(str(tmp_path), qwen, run_dir="run").write(5, 4, batch, {"loss": 0.1, "grad_norm": 2.0})
    back = read_batch(str(tmp_path), 5)
    assert back.keys() == {k for k, v in batch.items() if isinstance(v, torch.Tensor)}
    for key, value in back.items():
        assert value.dtype == batch[key].dtype and torch.equal(value, batch[key]), key
    meta = read_meta(str(tmp_path), 5)
    assert meta["version"] == 4 and meta["update_stats"] == {"loss": 0.1, "grad_norm": 2.0}
    assert meta["run_dir"] == os.path.abspath("run")
    rows = read_rows(str(tmp_path), 5)
    for row, ids, mask in zip(rows, batch["input_ids"], batch["attention_mask"]):
        start = row["loss_mask"].index(1)
        assert row["prompt"] == qwen.decode(ids[:start]) and row["completion"] == qwen.decode(ids[start : mask.sum()])


def test_only_the_newest_steps_are_kept_and_an_unfinished_step_is_not_offered(tmp_path, qwen):
    dump = RolloutDump(str(tmp_path), qwen, keep_steps=2)
    for step in range(4):
        dump.write(step, step, _batch(step), {})
    assert dumped_steps(str(tmp_path)) == [2, 3]
    os.remove(tmp_path / "step_3" / "meta.json")
    assert dumped_steps(str(tmp_path)) == [2]
    with pytest.raises(FileNotFoundError, match=r"step 3 .*\(dumped steps: \[2\].*dump_keep_steps"):
        read_meta(str(tmp_path), 3)
    with pytest.raises(ValueError, match="keep_steps=-1"):
        RolloutDump(str(tmp_path), qwen, keep_steps=-1)

import json

import pytest

from arealite.config import ConfigError, DatasetConfig
from arealite.data.arithmetic import arithmetic_reward_fn, make_arithmetic_dataset
from arealite.data.loader import create_dataloader, filter_by_prompt_length, load_records
from arealite.data.math_datasets import DatasetError, gsm8k_final_answer, load_generic, load_gsm8k, load_math500


def test_gsm8k_normalised(shared_data):
    recs = load_gsm8k(str(shared_data / "gsm8k" / "test.jsonl"))
    assert len(recs) == 1319
    r = recs[0]
    assert set(r) == {"id", "messages", "answer", "solution"}
    assert r["messages"][0]["role"] == "user" and "####" in r["messages"][0]["content"]
    assert r["answer"] == r["solution"].split("####")[-1].strip().replace(",", "")
    assert len({x["id"] for x in recs}) == len(recs)


def test_gsm8k_answer_strips_commas():
    assert gsm8k_final_answer("so 1,000 + 234\n#### 1,234") == "1234"
    with pytest.raises(DatasetError, match="####"):
        gsm8k_final_answer("no marker here")


def test_math500_normalised(shared_data):
    recs = load_math500(str(shared_data / "math500" / "test.jsonl"))
    assert len(recs) == 500
    assert recs[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert "boxed" in recs[0]["messages"][0]["content"]


def test_bad_files(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_gsm8k(str(tmp_path / "missing.jsonl"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="empty"):
        load_gsm8k(str(empty))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text(json.dumps({"problem": "x", "answer": "1"}) + "\n")
    with pytest.raises(DatasetError, match="is it GSM8K"):
        load_gsm8k(str(wrong))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": \n')
    with pytest.raises(DatasetError, match="broken.jsonl:1"):
        load_gsm8k(str(broken))
    with pytest.raises(ConfigError, match="dataset.path"):
        load_records(DatasetConfig(type="gsm8k", path=""))


def test_generic_jsonl(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps({"prompt": "2+2?", "answer": 4}) + "\n" + json.dumps({"question": "q", "answer": "x"}) + "\n"
    )
    recs = load_generic(str(p))
    assert recs[0]["messages"] == [{"role": "user", "content": "2+2?"}] and recs[0]["answer"] == "4"


def test_arithmetic_deterministic_and_correct():
    a = make_arithmetic_dataset(200, seed=3)
    assert a == make_arithmetic_dataset(200, seed=3)
    assert a != make_arithmetic_dataset(200, seed=4)
    assert a != make_arithmetic_dataset(200, seed=3, split="test")
    for r in a:
        expr = r["messages"][0]["content"].rstrip("=")
        assert str(eval(expr)) == r["answer"]  # the task's answers are the real results
        ans = r["answer"]
        well_formed = list(range(len(ans) + 1))  # one token per character, then the stop token
        assert arithmetic_reward_fn("", ans, None, well_formed, answer=ans) == 1.0
        assert arithmetic_reward_fn("", f"{int(ans) + 1}", answer=ans) == 0.0
    assert arithmetic_reward_fn("", "no number", answer="3") == 0.0


def test_arithmetic_reward_needs_the_answer_then_the_stop():
    """Only `<answer><stop>` scores: no trailing text, no truncation, no hidden special tokens."""
    assert arithmetic_reward_fn("", "12", None, [5, 6, 0], answer="12", truncated=False) == 1.0
    assert arithmetic_reward_fn("", "12", None, [5, 6], answer="12", truncated=True) == 0.0  # budget ran out
    assert arithmetic_reward_fn("", "12 3", None, [5, 6, 7, 8, 0], answer="12") == 0.0  # a tail after the answer
    assert arithmetic_reward_fn("", " 12", None, [9, 5, 6, 0], answer="12") == 0.0  # a leading space
    # special tokens are skipped when decoding: "12" + <|im_start|> + <|im_end|> decodes to "12"
    assert arithmetic_reward_fn("", "12", None, [5, 6, 1, 0], answer="12") == 0.0
    with pytest.raises(ValueError, match="ops"):
        make_arithmetic_dataset(3, ops="/")


def test_dataloader_shards_and_resumes():
    recs = make_arithmetic_dataset(64, seed=0)
    loaders = [create_dataloader(recs, batch_size=8, rank=r, world_size=2, seed=1) for r in range(2)]
    ids = [[x["id"] for b in dl for x in b] for dl in loaders]
    assert len(ids[0]) == len(ids[1]) == 32
    assert not set(ids[0]) & set(ids[1])  # disjoint shards
    assert set(ids[0]) | set(ids[1]) == {r["id"] for r in recs}
    # resume mid-epoch from a state dict: the continuation equals the uninterrupted order
    dl = create_dataloader(recs, batch_size=8, rank=0, world_size=2, seed=1)
    it = iter(dl)
    first = [next(it) for _ in range(3)]
    state = dl.state_dict()
    rest = [x["id"] for b in it for x in b]
    dl2 = create_dataloader(recs, batch_size=8, rank=0, world_size=2, seed=1)
    dl2.load_state_dict(state)
    assert [x["id"] for b in dl2 for x in b] == rest
    assert [x["id"] for b in first for x in b] + rest == ids[0]
    with pytest.raises(ValueError, match="divisible"):
        create_dataloader(recs, batch_size=7, world_size=2)


def test_filter_by_prompt_length(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    recs = [
        {"messages": [{"role": "user", "content": "1+1="}]},
        {"messages": [{"role": "user", "content": "9 " * 200}]},
    ]
    assert filter_by_prompt_length(recs, tok, 64) == recs[:1]
    with pytest.raises(DatasetError, match="max_prompt_tokens"):
        filter_by_prompt_length(recs[1:], tok, 8)

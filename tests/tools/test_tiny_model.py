import json
import os

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.tools.tiny_model import build_tiny_model


def test_loads_and_ids_agree(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    raw = Tokenizer.from_file(os.path.join(tiny_model_dir, "tokenizer.json"))
    for text in ["What is 123 + 4567? #### 4690", "  John's 12 apples!!\n\nx", "3.14159 * 2 = 6.28318"]:
        assert tok.encode(text) == raw.encode(text).ids
    # Qwen2 splits digits one by one
    digits = [tok.decode([i]) for i in tok.encode("12345")]
    assert digits == list("12345")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tok)


def test_chat_template_is_chatml(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"


def test_deterministic_for_seed(tmp_path, tiny_model_dir):
    other = build_tiny_model(str(tmp_path / "again"), seed=0)
    a = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    b = AutoModelForCausalLM.from_pretrained(other).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with open(os.path.join(tiny_model_dir, "tokenizer.json")) as f1, open(os.path.join(other, "tokenizer.json")) as f2:
        assert json.load(f1)["model"] == json.load(f2)["model"]
    different = build_tiny_model(str(tmp_path / "seed1"), seed=1)
    c = AutoModelForCausalLM.from_pretrained(different).state_dict()
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])

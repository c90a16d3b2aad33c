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


def test_chat_template_without_tools_is_plain_chatml(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    conv = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
    ]
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conv)
    assert tok.apply_chat_template(conv, tokenize=False) == expected
    assert (
        tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        == expected + "<|im_start|>assistant\n"
    )


def test_chat_template_renders_tools_like_qwen25(tiny_model_dir):
    """Tool calls and results use Qwen2.5's markup; only the tool list in the system turn is terser."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tool = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate it.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}
    conv = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "12*34="},
        {"role": "assistant", "content": None, "tool_calls": [call, call]},
        {"role": "tool", "content": "408"},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    text = tok.apply_chat_template(conv, tools=[tool], tokenize=False)
    body = (
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n408\n</tool_response>\n<tool_response>\n408\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n408<|im_end|>\n"
    )
    assert text == (
        "<|im_start|>system\nUse tools.\n\n# Tools\ncalculator(expression): Evaluate it.\n<|im_end|>\n"
        "<|im_start|>user\n12*34=<|im_end|>\n" + body
    )

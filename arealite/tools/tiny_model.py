"""Build a tiny random Qwen2-architecture causal LM and a tokenizer, fully offline.

    python -m arealite.tools.tiny_model OUT_DIR [--layers 2 --hidden 64 --seed 0]

The tokenizer is a byte-level BPE trained on the spot with Qwen2's own normalizer and
pre-tokenizer (digits split one by one), so `AutoTokenizer` on the folder — which builds a
`Qwen2Tokenizer` from `config.json`'s model type — encodes exactly like the raw tokenizer.
It carries ChatML special tokens and a ChatML chat template (with Qwen2.5's tool-call markup). Weights are random and
deterministic for a seed. Used by tests and by the CPU main job; no model hub is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import random

# Qwen2's pre-tokenizer pattern: contractions, letters, single digits, punctuation, spaces.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML. Without tools every message renders as `<|im_start|>role\ncontent<|im_end|>\n`.
# With tools it uses Qwen2.5's tool markup (so `arealite.chat` parses both alike): a system
# turn listing each tool as `name(params): description` (terse, for a tiny context), assistant
# tool calls as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, and tool results
# as a user turn of `<tool_response>` blocks.
CHATML_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool['function'] if tool['function'] is defined else tool %}"
    "{%- set params = fn['parameters']['properties'] if fn['parameters'] is defined else {} %}"
    "{{- fn['name'] + '(' + (params | list | join(', ')) + '): ' + (fn['description'] or '') + '\n' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' + (fn['arguments'] | tojson) + "
    "'}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

_WORDS = (
    "the a an of to and in is it that for on with as was he she they you we at by from "
    "what how many much total each has have had more less than left after before then "
    "answer question solve compute sum difference product plus minus times divided equals "
    "apples books dollars cents hours minutes days people students cookies eggs boxes "
    "John Mary Tom Sarah buys sells gives gets makes spends earns pays needs wants "
    "system user assistant step so therefore remaining half twice three four five"
).split()


def _corpus(seed: int, n_lines: int = 3000) -> list[str]:
    """Deterministic training text: arithmetic, word problems, ChatML scaffolding."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12)))
        lines.append(f"What is {a} {op} {b}? {words}. The answer is #### {a + b}\n")
        lines.append(f"user\n{words} {a}{op}{b}=\nassistant\n{a} {op} {b} = \\boxed{{{a * 2}}}\n")
    return lines


def train_tokenizer(seed: int = 0, vocab_size: int = 512):
    """Train a byte-level BPE tokenizer with Qwen2's pre-tokenization on synthetic text."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def build_tiny_model(
    out_dir: str,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    vocab_size: int = 512,
    max_positions: int = 1024,
    seed: int = 0,
    tie: bool = False,
) -> str:
    """Write a random Qwen2 causal LM and its tokenizer to `out_dir`; returns `out_dir`.

    `tie`: the output layer shares the input embedding's weight, as in small instruct models."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if hidden % heads != 0 or heads % kv_heads != 0:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}, and heads by kv_heads={kv_heads}")
    os.makedirs(out_dir, exist_ok=True)
    raw = train_tokenizer(seed=seed, vocab_size=vocab_size)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    _patch_tokenizer_config(out_dir)

    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
        bos_token_id=raw.token_to_id("<|endoftext|>"),
        eos_token_id=raw.token_to_id("<|im_end|>"),
        pad_token_id=raw.token_to_id("<|endoftext|>"),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}, f)
    return out_dir


def _patch_tokenizer_config(out_dir: str) -> None:
    """Make the saved tokenizer load as Qwen2's tokenizer class with our template."""
    path = os.path.join(out_dir, "tokenizer_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["chat_template"] = CHATML_TEMPLATE
    cfg["add_prefix_space"] = False
    cfg["model_max_length"] = 1024
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=512)
    p.add_argument("--max-positions", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="rebuild even if OUT_DIR already holds a model")
    a = p.parse_args(argv)
    if not a.overwrite and all(os.path.exists(os.path.join(a.out_dir, f)) for f in ("config.json", "tokenizer.json")):
        print(f"{a.out_dir} already holds a model; pass --overwrite to rebuild")
        return
    build_tiny_model(
        a.out_dir, a.layers, a.hidden, a.heads, a.kv_heads, a.intermediate, a.vocab_size, a.max_positions, a.seed
    )
    print(a.out_dir)


if __name__ == "__main__":
    main()

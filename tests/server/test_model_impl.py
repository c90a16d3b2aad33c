"""Which forward the model runner takes (`--model-impl`), and the lean forward's agreement
with transformers' own: in bf16, and after a weight update that replaces a parameter."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from arealite.server.hf_forward import TransformersForward
from arealite.server.model_runner import ModelRunner
from tests.tolerance import assert_close

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> str:
    """A tiny GPT-2: an architecture the lean forward does not cover."""
    out = str(tmp_path_factory.mktemp("gpt2"))
    config = GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=1, n_head=2)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(out)
    return out


def test_auto_falls_back_and_arealite_refuses_naming_the_fix(gpt2_dir):
    assert ModelRunner(gpt2_dir).impl == "transformers"
    with pytest.raises(ValueError, match=r"'gpt2'.*--model-impl transformers"):
        ModelRunner(gpt2_dir, model_impl="arealite")
    with pytest.raises(ValueError, match=r"'lean'.*not one of"):
        ModelRunner(gpt2_dir, model_impl="lean")


def test_auto_takes_the_lean_forward_for_qwen2(tiny_model_dir):
    assert ModelRunner(tiny_model_dir).impl == "arealite"
    assert ModelRunner(tiny_model_dir, model_impl="transformers").impl == "transformers"


def _run(runner: ModelRunner, steps: int) -> list[torch.Tensor]:
    """Prefill PROMPTS, then greedy decode; the logits of every step."""
    batch = runner.new_batch()
    logits = runner.prefill(batch, PROMPTS)
    out = [logits]
    for _ in range(steps):
        logits = runner.decode(batch, logits.argmax(-1))
        out.append(logits)
    return out


def test_bf16_lean_forward_agrees_with_transformers(tiny_model_dir):
    """What GPU users get: bf16 weights and activations. The two forwards round in different
    places (fused q/k/v, the rotary tables' layout), so they agree to bf16 rounding, not bits."""
    lean = _run(ModelRunner(tiny_model_dir, dtype="bfloat16", model_impl="arealite"), 8)
    ref = ModelRunner(tiny_model_dir, dtype="bfloat16", model_impl="transformers")
    # Feed the reference the lean run's tokens, so one rounding flip cannot fork the two paths.
    batch = ref.new_batch()
    got = [ref.prefill(batch, PROMPTS)]
    for step in lean[:-1]:
        got.append(ref.decode(batch, step.argmax(-1)))
    for a, b in zip(lean, got):
        # bf16 through 2 layers of 64- and 128-long dot products; logits of magnitude ~0.5
        assert_close(a, b, dtype=torch.bfloat16, n=128, k=2.0)


def test_lean_forward_sees_a_replaced_parameter_after_refresh(tiny_model_dir):
    """Updates copy into the fused buffers in place; one that REPLACES a fused parameter
    (a user's `load_state_dict(assign=True)`, say) is picked up by `weights_changed`."""
    runner = ModelRunner(tiny_model_dir, model_impl="arealite")
    before = _run(runner, 2)
    q = runner.model.model.layers[0].self_attn.q_proj
    torch.manual_seed(1)
    with runner.lock:
        q.weight = torch.nn.Parameter(torch.randn_like(q.weight) * 0.2, requires_grad=False)
        runner.weights_changed()
    after = _run(runner, 2)
    reference = TransformersForward(runner.model, runner.dtype, runner.device)
    batch = reference.new_batch()
    with torch.inference_mode():
        want = [reference.prefill(batch, PROMPTS, False)]
        for step in after[:-1]:
            want.append(reference.decode(batch, step.argmax(-1)))
    assert (before[0] - after[0]).abs().max() > 1e-3  # the update changed the output
    for a, b in zip(after, want):
        assert_close(a, b, n=128)

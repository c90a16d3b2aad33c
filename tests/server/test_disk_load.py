"""`load_from_disk` reads safetensors straight into the served model, tied weights included,
and keeps nothing from one load to the next."""

import gc
import tracemalloc
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from arealite.server.model_runner import ModelRunner
from arealite.server.weights import load_from_disk
from arealite.utils import hf_weights


def _tied_model(src: str, dst: str, seed: int) -> str:
    config = AutoConfig.from_pretrained(src)
    config.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(dst)  # writes the tied embedding once
    return dst


def test_tied_checkpoint_loads_and_matches_a_fresh_model(tiny_model_dir, tmp_path):
    old = _tied_model(tiny_model_dir, str(tmp_path / "old"), seed=1)
    new = _tied_model(tiny_model_dir, str(tmp_path / "new"), seed=2)
    runner = ModelRunner(old)
    load_from_disk(SimpleNamespace(runner=runner), new)
    fresh = ModelRunner(new)
    prompts = [[5, 6, 7, 8], [9, 10]]
    got = runner.prefill(runner.new_batch(), prompts)
    want = fresh.prefill(fresh.new_batch(), prompts)
    assert torch.equal(got, want)
    assert runner.model.lm_head.weight.data_ptr() == runner.model.model.embed_tokens.weight.data_ptr()  # still tied


def test_checkpoint_of_another_architecture_is_refused_and_weights_stay(tiny_model_dir, tmp_path):
    runner = ModelRunner(tiny_model_dir)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.num_hidden_layers, config.layer_types = 3, ["full_attention"] * 3
    AutoModelForCausalLM.from_config(config).save_pretrained(str(tmp_path / "deeper"))
    with pytest.raises(RuntimeError, match=r"parameter names differ.*model\.layers\.2"):
        load_from_disk(SimpleNamespace(runner=runner), str(tmp_path / "deeper"))
    assert all(torch.equal(before[k], v) for k, v in runner.model.state_dict().items())


@pytest.mark.skipif(
    not hf_weights._HAS_BACKEND, reason="this safetensors (< 0.8) has no pread reader to load without a per-call leak"
)
def test_repeated_loads_keep_no_python_memory(tiny_model_dir):
    """A server loads its checkpoint at every disk weight update: the Python memory still held
    after a load must not grow with the number of loads. A leak grows in every window of loads
    (~1.5 KB per load of this 27-tensor model would add ~150 KB per window); caches and free
    lists that settle leave at least one window flat, whatever the process ran before."""
    state = SimpleNamespace(runner=ModelRunner(tiny_model_dir))
    warmup, window, windows = 100, 100, 4
    tracemalloc.start()
    try:
        for _ in range(warmup):  # one-off allocations (caches, free lists) settle
            load_from_disk(state, tiny_model_dir)
        gc.collect()
        held = [tracemalloc.get_traced_memory()[0]]
        for _ in range(windows):
            for _ in range(window):
                load_from_disk(state, tiny_model_dir)
            gc.collect()
            held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    grown = [b - a for a, b in zip(held, held[1:])]
    assert min(grown) < 32 * 1024, f"bytes still held grew in every window of {window} loads: {grown}"

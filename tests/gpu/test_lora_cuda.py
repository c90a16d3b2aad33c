"""GPU self-check, LoRA: the adapter trains in bf16 mixed precision on CUDA, syncs to a bf16
built-in server on the GPU (weight_update=lora), and the served logprobs agree with the
trainer's within bf16 rounding while clearly differing from the base model's. Skipped
without CUDA or peft.

    python -m pytest -m cuda -q -s tests/gpu/test_lora_cuda.py
"""

from __future__ import annotations

import pytest

pytest.importorskip("peft", reason="LoRA needs peft: pip install 'arealite[lora]'")

from tests.tolerance import EPS_BF16
from tests.train.test_lora_sync import sync_and_compare

pytestmark = pytest.mark.cuda


@pytest.mark.timeout(300)
def test_lora_sync_in_bf16_on_cuda(tiny_model_dir, tmp_path):
    for version, f in enumerate(sync_and_compare(tiny_model_dir, tmp_path, "bfloat16"), 1):
        # bf16 logits are known to ~eps_bf16 * max|logit| each; server (KV-cache decode, adapter
        # by hooks) and trainer (packed prefill, peft layers) may differ by twice that
        bound = 2 * EPS_BF16 * f["max_logit"]
        print(
            f"bf16 LoRA v{version}: trainer vs server {f['trainer']:.2e} (bound {bound:.2e}); base vs server "
            f"{f['base']:.2e}"
        )
        assert f["trainer"] <= bound, f"bf16 trainer vs server mean |logprob diff| {f['trainer']} > {bound}"
        assert f["base"] > 4 * bound, (
            f"the served logprobs are the base model's ({f['base']}): the adapter was not applied"
        )

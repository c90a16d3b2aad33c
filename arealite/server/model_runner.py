"""The model side of the built-in server: the weights, and the forward that runs them.

The weights are always a transformers causal LM's (loaded by transformers, named by their
HF names: weight updates and LoRA adapters address them so). Two forwards run them
(`--model-impl`, SGLang's flag name):
* `arealite` (lean_model.py): an own forward for the Qwen2/Llama/Mistral family over a
  preallocated KV cache (kv_cache.py); several times faster per decode step on a CPU.
* `transformers` (hf_forward.py): the model's own forward over a DynamicCache; any
  architecture transformers runs.
`auto` (the default) takes `arealite` when the architecture is supported, else
`transformers`. Both give the same logits up to float rounding.

The scheduler holds one batch (`new_batch`) of running rows: `prefill` appends rows,
`decode` advances every row by one token, `batch.drop(rows)` removes rows and returns the
survivors' old indices in their new order, `batch.clear()` removes all.
"""

from __future__ import annotations

import logging
import threading

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from arealite.server import attention
from arealite.server.deterministic import RowBatches
from arealite.server.hf_forward import HFBatch, TransformersForward
from arealite.server.kv_cache import KVCache
from arealite.server.lean_model import LeanModel, unsupported_reason
from arealite.server.lora import AdapterSet

DTYPES = {
    "auto": None,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}
MODEL_IMPLS = ("auto", "arealite", "transformers")
Batch = KVCache | HFBatch  # the running rows of one forward (`ModelRunner.new_batch`)
logger = logging.getLogger("arealite.server")


def resolve_dtype(name: str, model_path: str) -> torch.dtype:
    """SGLang's `--dtype`: `auto` takes the checkpoint's dtype, except fp32 stays fp32 on CPU."""
    if name not in DTYPES:
        raise ValueError(f"--dtype {name!r} is not one of {sorted(DTYPES)}")
    if DTYPES[name] is not None:
        return DTYPES[name]
    config = AutoConfig.from_pretrained(model_path)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    # bf16/fp16 matmuls on CPU are slow and imprecise; SGLang would run them on a GPU.
    return dtype if torch.cuda.is_available() else torch.float32


def load_model(model_path: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Load a causal LM for inference (eval mode, no grad)."""
    # Additive masks keep fully padded query rows finite (a boolean sdpa mask can give NaN
    # there, and NaN keys would leak into real rows through 0 * NaN); grouped sdpa reads the
    # KV cache without eager attention's per-step repeat_kv copy (server/attention.py).
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation=attention.register())
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


class ModelRunner:
    """Runs prefill and decode forwards; holds the model behind a lock for weight swaps."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        device: str = "cpu",
        model_impl: str = "auto",
        deterministic: bool = False,
    ):
        if model_impl not in MODEL_IMPLS:
            raise ValueError(f"--model-impl {model_impl!r} is not one of {MODEL_IMPLS}")
        self.device = device
        self.dtype = resolve_dtype(dtype, model_path)
        self.model = load_model(model_path, self.dtype, device)
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        # Held for the duration of a forward and of a weight load, so weights never change mid-step.
        self.lock = threading.RLock()
        self.forward = self._choose(model_impl)
        self.impl: str = self.forward.name
        self.lora = AdapterSet(self.model, self.lock)  # disabled until the CLI enables it (--enable-lora)
        self.deterministic = deterministic  # --enable-deterministic-inference: one forward per sequence

    @property
    def lora(self) -> AdapterSet:
        return self._lora

    @lora.setter
    def lora(self, adapters: AdapterSet) -> None:
        self._lora = self.forward.lora = adapters  # the lean forward applies them itself

    def _choose(self, model_impl: str) -> LeanModel | TransformersForward:
        reason = unsupported_reason(self.model) if model_impl != "transformers" else None
        if model_impl == "transformers" or (model_impl == "auto" and reason is not None):
            if reason is not None:
                logger.info("model runner: transformers forward (the lean forward does not run this model: %s)", reason)
            return TransformersForward(self.model, self.dtype, self.device)
        if reason is not None:
            raise ValueError(
                f"--model-impl arealite cannot run {self.config.model_type!r}: {reason}. "
                "Pass --model-impl transformers (or auto)"
            )
        return LeanModel(self.model, self.dtype, self.device)

    def new_batch(self) -> Batch | RowBatches:
        """An empty batch of running rows for this runner's forward (deterministic.py's
        single-row batches with --enable-deterministic-inference)."""
        if self.deterministic:
            return RowBatches(self.forward.new_batch)
        return self.forward.new_batch()

    @torch.inference_mode()
    def prefill(
        self, batch: Batch, prompts: list[list[int]], all_logits: bool = False, adapters: list | None = None
    ) -> torch.Tensor:
        """Append `prompts` to `batch` as its last rows; returns fp32 logits ([n, V] at the last
        position, or with `all_logits` [n, L, V] left-padded). `adapters[i]`: prompt i's LoRA
        adapter (None: the base model)."""
        if isinstance(batch, RowBatches):  # one step under one lock: the weights cannot change between rows
            with self.lock:
                return batch.prefill(
                    lambda row, p, i: self.prefill(row, [p], all_logits, _pick(adapters, i)), prompts, all_logits
                )
        with self.lock, self.lora.rows(adapters):
            return self.forward.prefill(batch, prompts, all_logits)

    @torch.inference_mode()
    def decode(self, batch: Batch, tokens: torch.Tensor, adapters: list | None = None) -> torch.Tensor:
        """Feed one pending token per row ([B] long); extends the cache; returns fp32 logits [B, V]."""
        if isinstance(batch, RowBatches):
            with self.lock:
                return batch.decode(lambda row, t, i: self.decode(row, t, _pick(adapters, i)), tokens)
        with self.lock, self.lora.rows(adapters):
            return self.forward.decode(batch, tokens)

    def weights_changed(self) -> None:
        """Called (under the lock) after weights were copied into the model."""
        self.forward.refresh()


def _pick(adapters: list | None, i: int) -> list | None:
    return None if adapters is None else [adapters[i]]

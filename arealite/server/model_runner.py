"""The model side of the built-in server: a transformers causal LM and a batched KV cache.

The running batch keeps ONE transformers `DynamicCache` whose rows are left-padded to a
common length, plus a 0/1 mask over the cached positions and the position id of each row's
next token. Rows join (`merge`) and leave (`select`) between decode steps; leading columns
that became padding for every row are trimmed. Padding is masked out of attention and
position ids count real tokens only, so a row's logits equal those of the same sequence run
alone (up to float summation order, ~1e-6 in fp32).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from arealite.server import attention
from arealite.server.lora import AdapterSet

DTYPES = {
    "auto": None,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}


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


@dataclass
class KVBatch:
    """KV cache of the running rows, left-padded to a common length."""

    cache: DynamicCache
    mask: torch.Tensor  # [B, L] long, 1 on real cached tokens
    next_pos: torch.Tensor  # [B] long, position id of each row's next (pending) token

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    def _layers(self):
        return [layer for layer in self.cache.layers if layer.is_initialized]

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order), then drop leading all-padding columns."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        self.mask = self.mask[idx]
        self.next_pos = self.next_pos[idx]
        # Keep at least one column so shapes stay valid while rows remain.
        lead = int((self.mask.cumsum(1) == 0).all(0).sum().item()) if self.mask.shape[0] else 0
        lead = min(lead, self.mask.shape[1] - 1) if self.mask.shape[1] else 0
        self.mask = self.mask[:, lead:]
        for layer in self._layers():
            layer.keys = layer.keys[idx, :, lead:]
            layer.values = layer.values[idx, :, lead:]

    def merge(self, other: KVBatch) -> None:
        """Append `other`'s rows after ours, left-padding whichever is shorter."""
        la, lb = self.mask.shape[1], other.mask.shape[1]
        length = max(la, lb)
        self.mask = torch.cat([_pad_left(self.mask, length - la), _pad_left(other.mask, length - lb)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        for mine, theirs in zip(self._layers(), other._layers()):
            mine.keys = torch.cat([_pad_left(mine.keys, length - la), _pad_left(theirs.keys, length - lb)])
            mine.values = torch.cat([_pad_left(mine.values, length - la), _pad_left(theirs.values, length - lb)])


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Pad the sequence dimension (dim 1 of a mask [B,L], dim 2 of keys [B,H,L,D]) with n zeros."""
    if n == 0:
        return t
    dim = 1 if t.dim() == 2 else 2
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class ModelRunner:
    """Runs prefill and decode forwards; holds the model behind a lock for weight swaps."""

    def __init__(self, model_path: str, dtype: str = "auto", device: str = "cpu"):
        self.device = device
        self.dtype = resolve_dtype(dtype, model_path)
        self.model = load_model(model_path, self.dtype, device)
        self.config = self.model.config
        self.vocab_size = int(self.config.vocab_size)
        # Held for the duration of a forward and of a weight load, so weights never change mid-step.
        self.lock = threading.RLock()
        layer_types = getattr(self.config, "layer_types", None) or ["full_attention"]
        # Decode steps may pass a ready 4D mask (transformers uses it as is), skipping mask
        # construction that costs as much as the forward of a tiny model. Only valid when no
        # layer needs a sliding-window mask.
        self._prebuilt_decode_mask = all(t == "full_attention" for t in layer_types)
        self.lora = AdapterSet(self.model, self.lock)  # disabled until the CLI enables it (--enable-lora)

    @torch.inference_mode()
    def prefill(
        self, prompts: list[list[int]], all_logits: bool = False, adapters: list | None = None
    ) -> tuple[torch.Tensor, KVBatch]:
        """Run left-padded prompts; returns fp32 logits ([n, V] last position, or [n, L, V]) and their cache.
        `adapters[i]`: the LoRA adapter of prompt i (None: the base model)."""
        length = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), length, dtype=torch.long)
        mask = torch.zeros(len(prompts), length, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, length - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, length - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        # No config: every layer is a plain full-length DynamicLayer that merge/select can
        # pad and slice; sliding-window models still get their window from the attention mask.
        cache = DynamicCache()
        with self.lock, self.lora.rows(adapters):
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=0 if all_logits else 1,
            )
        logits = out.logits.float()
        next_pos = mask.sum(1)
        return (logits if all_logits else logits[:, -1]), KVBatch(out.past_key_values, mask, next_pos)

    @torch.inference_mode()
    def decode(self, batch: KVBatch, tokens: torch.Tensor, adapters: list | None = None) -> torch.Tensor:
        """Feed one pending token per row ([B] long); extends the cache; returns fp32 logits [B, V]."""
        mask = torch.cat([batch.mask, batch.mask.new_ones(batch.size, 1)], dim=1)
        attention = mask
        if self._prebuilt_decode_mask:
            # Additive [B, 1, 1, L]: 0 on real tokens, dtype-min on padding (one query per row).
            attention = (1 - mask)[:, None, None, :].to(self.dtype) * torch.finfo(self.dtype).min
        with self.lock, self.lora.rows(adapters):
            out = self.model(
                input_ids=tokens.to(self.device)[:, None],
                attention_mask=attention,
                position_ids=batch.next_pos[:, None],
                past_key_values=batch.cache,
                use_cache=True,
            )
        batch.cache = out.past_key_values
        batch.mask = mask
        batch.next_pos = batch.next_pos + 1
        return out.logits[:, -1].float()

    def swap_model(self, model: torch.nn.Module) -> None:
        """Replace the whole model (disk update); the caller has checked the architecture."""
        with self.lock:
            self.model = model
            self.config = model.config

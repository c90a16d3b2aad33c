"""The transformers path of the model runner (`--model-impl transformers`, and the fallback for
architectures the lean forward does not cover): the model's own forward over a DynamicCache.

The running batch keeps ONE transformers `DynamicCache` whose rows are left-padded to a
common length, plus a 0/1 mask over the cached positions and the position id of each row's
next token. Rows join (`merge`) and leave (`select`) between decode steps; leading columns
that became padding for every row are trimmed. Padding is masked out of attention and
position ids count real tokens only, so a row's logits equal those of the same sequence run
alone (up to float summation order, ~1e-6 in fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


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


class HFBatch:
    """The running rows of the transformers path (the runner's batch interface)."""

    def __init__(self) -> None:
        self.kv: KVBatch | None = None

    @property
    def size(self) -> int:
        return 0 if self.kv is None else self.kv.size

    def drop(self, rows: set[int] | list[int]) -> list[int]:
        """Remove `rows`; returns the surviving rows' old indices (order kept)."""
        keep = [i for i in range(self.size) if i not in set(rows)]
        if not keep:
            self.kv = None
        elif len(keep) < self.size:
            self.kv.select(keep)
        return keep

    def clear(self) -> None:
        self.kv = None


class TransformersForward:
    """Prefill and decode through the transformers model's forward."""

    name = "transformers"

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device: str):
        self.model, self.dtype, self.device = model, dtype, device
        layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
        # Decode steps may pass a ready 4D mask (transformers uses it as is), skipping mask
        # construction that costs as much as the forward of a tiny model. Only valid when no
        # layer needs a sliding-window mask.
        self._prebuilt_decode_mask = all(t == "full_attention" for t in layer_types)

    def new_batch(self) -> HFBatch:
        return HFBatch()

    def refresh(self) -> None:
        """Weights were copied in place: the model reads them as they are."""

    def prefill(self, batch: HFBatch, prompts: list[list[int]], all_logits: bool) -> torch.Tensor:
        """Left-padded prompts appended to `batch`; fp32 logits ([n, V] last position, or [n, L, V])."""
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
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=DynamicCache(),
            use_cache=True,
            logits_to_keep=0 if all_logits else 1,
        )
        new = KVBatch(out.past_key_values, mask, mask.sum(1))
        if batch.kv is None:
            batch.kv = new
        else:
            batch.kv.merge(new)
        logits = out.logits.float()
        return logits if all_logits else logits[:, -1]

    def decode(self, batch: HFBatch, tokens: torch.Tensor) -> torch.Tensor:
        """One pending token per row ([B] long); extends the cache; fp32 logits [B, V]."""
        kv = batch.kv
        mask = torch.cat([kv.mask, kv.mask.new_ones(kv.size, 1)], dim=1)
        attention = mask
        if self._prebuilt_decode_mask:
            # Additive [B, 1, 1, L]: 0 on real tokens, dtype-min on padding (one query per row).
            attention = (1 - mask)[:, None, None, :].to(self.dtype) * torch.finfo(self.dtype).min
        out = self.model(
            input_ids=tokens.to(self.device)[:, None],
            attention_mask=attention,
            position_ids=kv.next_pos[:, None],
            past_key_values=kv.cache,
            use_cache=True,
        )
        kv.cache = out.past_key_values
        kv.mask = mask
        kv.next_pos = kv.next_pos + 1
        return out.logits[:, -1].float()

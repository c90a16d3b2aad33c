"""Batch-invariant forwards: `--enable-deterministic-inference` (SGLang's flag name).

SGLang's deterministic mode makes a request's numerics independent of what shares its batch
(batch-invariant kernels). Here every running sequence keeps a batch of its own and goes
through the model alone, in prefill and in every decode step: its matmuls always have one
row and its attention spans only its own tokens, so what else runs cannot change a bit of
its logits. Sampling is already per request (seeded uniform streams, row-wise ops). The price
is one forward per sequence per step instead of one per step (benchmarks/deterministic_server.py).
A sequence re-prefilled after a `retract` pause or resubmitted after an `abort` takes another
path through the model than uninterrupted decoding, as in SGLang.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class RowBatches:
    """The runner's batch interface over one single-row batch per running sequence."""

    def __init__(self, new_batch: Callable[[], object]) -> None:
        self._new_batch = new_batch
        self.rows: list = []

    @property
    def size(self) -> int:
        return len(self.rows)

    def drop(self, rows: set[int] | list[int]) -> list[int]:
        """Remove `rows`; returns the surviving rows' old indices (order kept)."""
        gone = set(rows)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        return keep

    def clear(self) -> None:
        self.rows = []

    def prefill(self, prefill_one, prompts: list[list[int]], all_logits: bool) -> torch.Tensor:
        """`prefill_one(batch, prompt, i)` -> logits of one prompt in a new batch of its own;
        returns the forward's layout ([n, V], or [n, L, V] left-padded)."""
        outs = []
        for i, prompt in enumerate(prompts):
            row = self._new_batch()
            outs.append(prefill_one(row, prompt, i)[0])  # [V] or [len, V]
            self.rows.append(row)
        if not all_logits:
            return torch.stack(outs)
        length = max(o.shape[0] for o in outs)
        left = outs[0].new_zeros(len(outs), length, outs[0].shape[-1])
        for i, o in enumerate(outs):
            left[i, length - o.shape[0] :] = o
        return left

    def decode(self, decode_one, tokens: torch.Tensor) -> torch.Tensor:
        """`decode_one(batch, token [1], i)` -> logits [1, V] per row; returns [B, V]."""
        return torch.cat([decode_one(row, tokens[i : i + 1], i) for i, row in enumerate(self.rows)])

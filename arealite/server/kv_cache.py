"""The lean runner's KV cache: preallocated rows, written in place, rows moved only when one leaves.

Two tensors per cache, keys and values, each `[layers, rows, kv_heads, columns, head_dim]`.
Row r is one running sequence; its tokens sit at
columns 0..len_r-1, so a token's column is its position id and no row is padded on the left.
A decode step writes each row's new key/value at column len_r and attends over columns
0..len_r (sdpa: over 0..max(len) with a mask that hides each row's columns past its own
length; stale values there are finite: the buffers start zeroed and only ever hold keys and
values written by earlier steps, so masked scores underflow to exactly zero).

Compared with transformers' DynamicCache (`torch.cat` per layer per step, and a full copy of
the cache whenever a row joins or leaves), a step here writes B x kv_heads x head_dim
numbers per layer, a leaving row costs one row copy (the last row moves into its place,
so rows change order: `drop` says how), and the buffers grow by doubling, rarely.
"""

from __future__ import annotations

import torch

MIN_COLUMNS = 256  # first allocation; doubled as sequences grow


class KVCache:
    """Rows of running sequences; the scheduler's row i is row i here."""

    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.k = self._empty(0, 0)
        self.v = self._empty(0, 0)
        self.lens: list[int] = []  # cached tokens per row (Python: widths need no device sync)
        self.pos = torch.zeros(0, dtype=torch.long, device=self.device)  # [rows] the same, on the device
        self._columns = torch.zeros(0, dtype=torch.long, device=self.device)  # arange(columns)
        self._slots = self._columns  # set by begin_decode for write_decode

    @property
    def size(self) -> int:
        return len(self.lens)

    # ---- rows joining and leaving ----------------------------------------------------------

    def reserve(self, rows: int, columns: int) -> int:
        """Make room for `rows` more rows of up to `columns` tokens; returns the first new row.
        The new rows count as empty until `commit`."""
        start = self.size
        self._grow(start + rows, columns)
        return start

    def commit(self, lens: list[int]) -> None:
        """The rows reserved last now hold `lens` tokens each."""
        start = self.size
        self.lens.extend(lens)
        self.pos[start : start + len(lens)] = torch.tensor(lens, dtype=torch.long).to(self.device)

    @torch.inference_mode()  # the buffers are inference tensors (made in the runner's forward)
    def drop(self, rows: set[int] | list[int]) -> list[int]:
        """Remove `rows`; returns the surviving rows' old indices in their new order. Each
        removed row below the new size takes a surviving row from past it (one row copy)."""
        gone = set(rows)
        survivors = [i for i in range(self.size) if i not in gone]
        keep = len(survivors)
        holes = [i for i in sorted(gone) if i < keep]  # as many as survivors at or past `keep`
        movers = [i for i in survivors if i >= keep]
        order = list(range(keep))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            src = torch.tensor(movers, dtype=torch.long, device=self.device)
            width = max(self.lens[m] for m in movers)
            for t in (self.k, self.v):
                t[:, dst, :, :width] = t[:, src, :, :width]
            self.pos[dst] = self.pos[src]
        self.lens = [self.lens[i] for i in order]
        return order

    def clear(self) -> None:
        """Forget every row (the buffer stays allocated for the next ones)."""
        self.lens = []

    # ---- what the forward reads and writes -------------------------------------------------

    def keys(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s keys as [rows, kv_heads, columns, head_dim]."""
        return self.k[layer]

    def values(self, layer: int) -> torch.Tensor:
        return self.v[layer]

    def write_prefill(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k/v [n, kv_heads, L, head_dim] of n prompts (right-padded) into rows start..start+n-1."""
        n, length = k.shape[0], k.shape[2]
        self.keys(layer)[start : start + n, :, :length] = k
        self.v[layer, start : start + n, :, :length] = v

    def begin_decode(self) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Before a decode step: (positions [B] of the incoming tokens, the width to attend
        over, an additive mask [B, 1, 1, width] hiding each row's columns past its token)."""
        width = max(self.lens) + 1
        self._grow(self.size, width)
        pos = self.pos[: self.size]
        hidden = self._columns[None, :width] > pos[:, None]
        mask = torch.zeros(hidden.shape, dtype=self.dtype, device=self.device).masked_fill_(
            hidden, torch.finfo(self.dtype).min
        )
        # each (row, kv head)'s slot for the new token in a layer's values seen as [-1, head_dim] rows
        rows_heads = self._columns[: self.size, None] * self.kv_heads + self._columns[None, : self.kv_heads]
        self._slots = (rows_heads * self.v.shape[3] + pos[:, None]).flatten()
        return pos, width, mask[:, None, None, :]

    def write_decode(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k/v [B, kv_heads, head_dim]: each row's new token at its column (the position
        `begin_decode` returned)."""
        d = self.head_dim
        self.k[layer].view(-1, d).index_copy_(0, self._slots, k.reshape(-1, d))
        self.v[layer].view(-1, d).index_copy_(0, self._slots, v.reshape(-1, d))

    def end_decode(self) -> None:
        self.lens = [n + 1 for n in self.lens]
        self.pos[: self.size] += 1

    # ---- capacity --------------------------------------------------------------------------

    def _empty(self, rows: int, columns: int) -> torch.Tensor:
        shape = (self.layers, rows, self.kv_heads, columns, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _grow(self, rows: int, columns: int) -> None:
        have_rows, have_cols = self.v.shape[1], self.v.shape[3]
        if rows <= have_rows and columns <= have_cols:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_cols = max(columns, 2 * have_cols, MIN_COLUMNS) if columns > have_cols else have_cols
        k, v = self._empty(new_rows, new_cols), self._empty(new_rows, new_cols)
        k[:, :have_rows, :, :have_cols] = self.k
        v[:, :have_rows, :, :have_cols] = self.v
        pos = torch.zeros(new_rows, dtype=torch.long, device=self.device)
        pos[:have_rows] = self.pos
        self.k, self.v, self.pos = k, v, pos
        self._columns = torch.arange(max(new_rows, new_cols), device=self.device)

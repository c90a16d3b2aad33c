"""The advantage functions' input checks (arealite/algo/advantages.py): shapes, devices, modes
and ranges, each failing with a ValueError that names the value and the fix."""

from __future__ import annotations

from torch import Tensor

GROUP_NORM_MODES = ("mean_std", "mean", "rloo")
# Divisor of the group variance: G (population) or G - 1 (sample, Bessel's correction).
GROUP_STDS = ("population", "sample")


def _check_gae_inputs(
    rewards: Tensor,
    values: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float,
    lam: float,
    check_cu_seqlens: bool = True,
) -> None:
    for name, t in (("rewards", rewards), ("values", values), ("loss_mask", loss_mask)):
        if t.dim() != 1:
            raise ValueError(
                f"gae_packed: {name} must be packed 1-D [N], got shape {tuple(t.shape)}; "
                "flatten padded [B, T] tensors with cu_seqlens first"
            )
    n = rewards.numel()
    if values.numel() != n or loss_mask.numel() != n:
        raise ValueError(
            f"gae_packed: rewards, values, loss_mask must have the same length, got "
            f"{n}, {values.numel()}, {loss_mask.numel()}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 or cu_seqlens.is_floating_point():
        raise ValueError(
            f"gae_packed: cu_seqlens must be an integer tensor [B+1], got dtype "
            f"{cu_seqlens.dtype} shape {tuple(cu_seqlens.shape)}"
        )
    devices = {t.device for t in (rewards, values, loss_mask, cu_seqlens)}
    if len(devices) > 1:
        raise ValueError(
            f"gae_packed: rewards, values, loss_mask, cu_seqlens are on different devices "
            f"{sorted(map(str, devices))}; move them to one device"
        )
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae_packed: gamma={gamma} and lam={lam} must both lie in [0, 1]")
    if check_cu_seqlens:
        bad = (cu_seqlens[0] != 0) | (cu_seqlens[-1] != n)
        if cu_seqlens.numel() > 1:
            bad = bad | (cu_seqlens[1:] < cu_seqlens[:-1]).any()
        if bool(bad):  # one host sync
            raise ValueError(
                f"gae_packed: cu_seqlens must start at 0, be non-decreasing and end at "
                f"N={n}; got {cu_seqlens.tolist()[:8]}...{cu_seqlens[-1].item()}"
            )


def _check_group_inputs(rewards: Tensor, group_size: int, mode: str, std: str) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"group_normalize: rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if mode not in GROUP_NORM_MODES:
        raise ValueError(f"group_normalize: unknown mode {mode!r}; use one of {GROUP_NORM_MODES}")
    if std not in GROUP_STDS:
        raise ValueError(f"group_normalize: unknown std {std!r}; use one of {GROUP_STDS}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_normalize: group_size={group_size!r} must be an int >= 1")
    if mode == "rloo" and group_size < 2:
        raise ValueError(
            "group_normalize: mode 'rloo' (leave-one-out) needs group_size >= 2, "
            f"got {group_size}; use mode 'mean' for single samples"
        )
    if rewards.numel() % group_size != 0:
        raise ValueError(
            f"group_normalize: batch size {rewards.numel()} is not a multiple of "
            f"group_size={group_size}; keep whole groups together (rows g*G..g*G+G-1)"
        )


def _check_same_shape(fn: str, x: Tensor, mask: Tensor) -> None:
    if x.shape != mask.shape:
        raise ValueError(f"{fn}: x shape {tuple(x.shape)} and mask shape {tuple(mask.shape)} differ")


def _check_broadcast_inputs(seq_values: Tensor, loss_mask: Tensor) -> None:
    if seq_values.dim() != 1 or loss_mask.dim() != 2 or loss_mask.shape[0] != seq_values.numel():
        raise ValueError(
            f"broadcast_to_tokens: expected seq_values [B] and loss_mask [B, T], got "
            f"{tuple(seq_values.shape)} and {tuple(loss_mask.shape)}"
        )

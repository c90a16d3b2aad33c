"""The stats of an update of several optimizer steps, merged into one dict."""

from __future__ import annotations


def merge_step_stats(steps: list[dict[str, float]]) -> dict[str, float]:
    """The stats of an update of several optimizer steps (`train_batch`'s each) as one dict:
    `*_max` / `*_min` keys by max / min, `loss_weight` summed, every other key the mean over
    the steps weighted by their `loss_weight` (so `loss` is that of the whole batch; equal
    weights if every step's is 0). One step's stats are returned as they are."""
    if len(steps) == 1:
        return dict(steps[0])
    total = sum(s["loss_weight"] for s in steps)
    weights = [s["loss_weight"] / total if total > 0 else 1 / len(steps) for s in steps]
    out = {}
    for key in steps[0]:
        values = [s[key] for s in steps]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        elif key == "loss_weight":
            out[key] = total
        else:
            out[key] = sum(w * v for w, v in zip(weights, values))
    return out

"""`RunSummary`: the closing lines a training run prints, from its step stats and evaluations:
`response_len_p50=<x> response_len_p95=<y>`, for asynchronous runs `mixed_version_frac=<f>`
(the share of trained samples whose tokens span a weight sync, over the run), then
`final_entropy=<e> truncated_frac=<t>` (these three: means over the last steps) and
`eval_accuracy_before=<x> eval_accuracy_after=<y>`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

RECENT = ("entropy", "truncated_frac", "response_len_p50", "response_len_p95")


class RunSummary:
    def __init__(self, asynchronous: bool, window: int = 10) -> None:
        self.asynchronous = asynchronous
        self.recent: deque[tuple[float, ...]] = deque(maxlen=window)  # the RECENT stats of the last steps
        self.mixed: list[float] = []  # mixed_version_frac of every step
        self.accuracy: dict[str, float] = {}  # version -> held-out pass@1 (kept in checkpoints)

    def add_step(self, stats: dict[str, Any]) -> None:
        self.recent.append(tuple(stats.get(k, float("nan")) for k in RECENT))
        self.mixed.append(stats.get("mixed_version_frac", float("nan")))

    def add_eval(self, version: int, stats: dict[str, Any]) -> None:
        self.accuracy[str(version)] = stats["eval/pass@1"]

    def lines(self) -> list[str]:
        out = []
        if self.recent:
            entropy, truncated, p50, p95 = (sum(v) / len(v) for v in zip(*self.recent))
            out.append(f"response_len_p50={p50:.1f} response_len_p95={p95:.1f}")
            if self.asynchronous:
                out.append(f"mixed_version_frac={sum(self.mixed) / len(self.mixed):.4f}")
            out.append(f"final_entropy={entropy:.4f} truncated_frac={truncated:.4f}")
        if self.accuracy:
            before, after = self.accuracy.get("0", float("nan")), self.accuracy[max(self.accuracy, key=int)]
            out.append(f"eval_accuracy_before={before:.4f} eval_accuracy_after={after:.4f}")
        return out

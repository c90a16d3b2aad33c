"""The records trained and evaluated on (`DatasetConfig`) and the periodic held-out evaluation
(`EvaluatorConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arealite.config.fields import check_choices, check_positive, setting

DatasetType = Literal["gsm8k", "math500", "arithmetic", "walk", "jsonl"]


@dataclass
class DatasetConfig:
    """A dataset and its loader."""

    path: str = setting(
        "",
        "what datasets reads: a json/jsonl/parquet/csv/arrow file, a save_to_disk folder, a folder of data "
        "files, or a cached hub name (HF_HUB_OFFLINE=1); unused for type=arithmetic",
    )
    type: DatasetType = setting(
        "gsm8k",
        "jsonl: generic records in any of path's formats; arithmetic and walk are synthetic (arealite/data/)",
    )
    split: str | None = setting(
        None,
        "split of a multi-split source (hub name, folder, DatasetDict); None: train for train_dataset, test "
        "for valid_dataset",
    )
    subset: str | None = setting(None, "hub dataset configuration, e.g. main for openai/gsm8k")
    batch_size: int = setting(8, "prompts per step (across all ranks)")
    shuffle: bool = setting(True, "reshuffle the records every epoch (seeded by the experiment seed)")
    num_samples: int = setting(1000, "size of a synthetic dataset (type=arithmetic or walk)")
    max_prompt_tokens: int | None = setting(None, "drop prompts longer than this")
    max_operand: int = setting(20, "type=arithmetic: operands are drawn from min_operand..max_operand")
    min_operand: int = setting(
        0, 'type=arithmetic: smallest operand (e.g. 32 with max 99 and ops "*": four-digit products)'
    )
    ops: str = setting("+-", "type=arithmetic: operators to draw from (any of + - *)")
    question: str = setting(
        "{a}{op}{b}=",
        "type=arithmetic: the user message, a format string of {a}, {op}, {b}; an instruction for an instruct model "
        '(e.g. "What is {a} {op} {b}? Reply with only the number.")',
    )
    median_steps: float = setting(7.0, "type=walk: median number of worked steps (log-normal, so a long tail)")
    max_steps: int = setting(99, "type=walk: most steps of a problem (at most 99)")

    def __post_init__(self) -> None:
        check_choices(self, "dataset")
        check_positive("dataset", "batch_size", self.batch_size)


@dataclass
class EvaluatorConfig:
    """Periodic evaluation on a held-out set (`arealite.eval`): pass@1, pass@k and maj@k."""

    freq_steps: int = setting(0, "evaluate every this many steps, before the first and after the last; 0: never")
    k: int = setting(4, "samples per prompt")
    temperature: float = setting(1.0, "sampling temperature of the evaluation (pass@1 is the mean accuracy)")
    max_new_tokens: int | None = setting(None, "defaults to gconfig.max_new_tokens")
    num_samples: int | None = setting(None, "evaluate on the first this-many held-out records; None: all")
    seed: int = setting(1234, "base of the per-sample sampling seeds, so a re-run reproduces the number")

    def __post_init__(self) -> None:
        check_positive("evaluator", "freq_steps", self.freq_steps, allow_zero=True)
        check_positive("evaluator", "k", self.k)
        check_positive("evaluator", "temperature", self.temperature, allow_zero=True)

"""Normalising known datasets to `{"id", "messages", "answer"}` records.

GSM8K records are `{"question", "answer"}` where the answer ends in `#### <number>`; MATH-500
records are `{"problem", "solution", "answer", "unique_id", ...}`. Generic records hold
`messages` or `prompt`/`question`/`problem`, plus `answer`. Every loader takes anything
`records.read_dataset` reads: a local file or folder, a cached hub name, or a
`datasets.Dataset`.
"""

from __future__ import annotations

from typing import Any

from arealite.data.records import DatasetError, read_records

__all__ = ["DatasetError", "gsm8k_final_answer", "load_generic", "load_gsm8k", "load_math500"]

GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer after '####'."
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def gsm8k_final_answer(solution: str) -> str:
    """The number after GSM8K's `####` marker, without thousands separators."""
    if "####" not in solution:
        raise DatasetError(f"GSM8K answer has no '####' marker: {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


def _present(record: dict[str, Any]) -> dict[str, Any]:
    """The record without null fields: a column that only some rows have (a union schema in
    `datasets`) comes back as None in the others."""
    return {k: v for k, v in record.items() if v is not None}


def _records_with(
    source: Any, split: str, subset: str | None, columns: tuple[str, ...], kind: str
) -> list[dict[str, Any]]:
    """The records of `source`, checked to have `columns` (every record, not only the schema)."""
    records = [_present(r) for r in read_records(source, split, subset)]
    for i, r in enumerate(records):
        missing = [c for c in columns if c not in r]
        if missing:
            raise DatasetError(
                f"{_name(source)} record {i} lacks {missing} (has {sorted(r)}); is it {kind}? "
                "Rename the columns (datasets.Dataset.rename_column) or set dataset.type=jsonl for generic records"
            )
    return records


def _name(source: Any) -> str:
    return str(source) if isinstance(source, str) else type(source).__name__


def load_gsm8k(source: Any, split: str = "train", subset: str | None = None) -> list[dict[str, Any]]:
    """GSM8K -> `{"id", "messages", "answer", "solution"}` records."""
    out = []
    for i, r in enumerate(_records_with(source, split, subset, ("question", "answer"), "GSM8K")):
        out.append(
            {
                "id": f"gsm8k-{i}",
                "messages": [{"role": "user", "content": f"{r['question']}\n{GSM8K_INSTRUCTION}"}],
                "answer": gsm8k_final_answer(r["answer"]),
                "solution": r["answer"],
            }
        )
    return out


def load_math500(source: Any, split: str = "train", subset: str | None = None) -> list[dict[str, Any]]:
    """MATH-500 -> `{"id", "messages", "answer", "solution"}` records."""
    out = []
    for i, r in enumerate(_records_with(source, split, subset, ("problem", "answer"), "MATH")):
        out.append(
            {
                "id": str(r.get("unique_id", f"math500-{i}")),
                "messages": [{"role": "user", "content": f"{r['problem']}\n{MATH_INSTRUCTION}"}],
                "answer": str(r["answer"]),
                "solution": r.get("solution", ""),
            }
        )
    return out


def load_generic(source: Any, split: str = "train", subset: str | None = None) -> list[dict[str, Any]]:
    """Records with `messages` or `prompt`/`question`/`problem`, plus `answer`; other fields are kept."""
    out = []
    for i, r in enumerate(_records_with(source, split, subset, ("answer",), "a dataset with answers")):
        if "messages" in r:
            messages = r["messages"]
        else:
            text = next((r[k] for k in ("prompt", "question", "problem") if k in r), None)
            if text is None:
                raise DatasetError(
                    f"{_name(source)} record {i} has none of 'messages', 'prompt', 'question', 'problem' "
                    f"(has {sorted(r)}); rename the prompt column to one of them"
                )
            messages = [{"role": "user", "content": str(text)}]
        out.append({**r, "id": str(r.get("id", f"rec-{i}")), "messages": messages, "answer": str(r["answer"])})
    return out

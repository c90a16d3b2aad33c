"""Loaders for math word-problem datasets, normalised to `{"id", "messages", "answer"}`.

GSM8K records are `{"question", "answer"}` where the answer ends in `#### <number>`; MATH-500
records are `{"problem", "solution", "answer", "unique_id", ...}`. Generic jsonl/parquet files
may hold `messages` or `prompt`/`question`/`problem` plus `answer`. Paths are local files: the
model hub is not assumed reachable (DESIGN §5).
"""

from __future__ import annotations

import json
import os
from typing import Any

GSM8K_INSTRUCTION = "Please reason step by step, and put your final answer after '####'."
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class DatasetError(ValueError):
    """A dataset file is missing, empty or has records of the wrong shape."""


def read_records(path: str) -> list[dict[str, Any]]:
    """Read a .jsonl or .parquet file (or the single such file in a folder) into dicts."""
    if os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith((".jsonl", ".parquet")))
        if len(files) != 1:
            raise DatasetError(f"folder {path!r} holds {len(files)} .jsonl/.parquet files; point to one file")
        path = os.path.join(path, files[0])
    if not os.path.isfile(path):
        raise DatasetError(f"dataset file {path!r} does not exist (cwd: {os.getcwd()}); check the dataset path")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        records = pq.read_table(path).to_pylist()
    else:
        records = []
        with open(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DatasetError(f"{path}:{lineno} is not valid JSON: {e}") from e
    if not records:
        raise DatasetError(f"dataset file {path!r} is empty; a training run needs at least one record")
    return records


def gsm8k_final_answer(solution: str) -> str:
    """The number after GSM8K's `####` marker, without thousands separators."""
    if "####" not in solution:
        raise DatasetError(f"GSM8K answer has no '####' marker: {solution[-80:]!r}")
    return solution.split("####")[-1].strip().replace(",", "")


def load_gsm8k(path: str) -> list[dict[str, Any]]:
    """GSM8K jsonl -> `{"id", "messages", "answer", "solution"}` records."""
    out = []
    for i, r in enumerate(read_records(path)):
        if "question" not in r or "answer" not in r:
            raise DatasetError(f"{path} record {i} lacks 'question'/'answer' keys (has {sorted(r)}); is it GSM8K?")
        out.append(
            {
                "id": f"gsm8k-{i}",
                "messages": [{"role": "user", "content": f"{r['question']}\n{GSM8K_INSTRUCTION}"}],
                "answer": gsm8k_final_answer(r["answer"]),
                "solution": r["answer"],
            }
        )
    return out


def load_math500(path: str) -> list[dict[str, Any]]:
    """MATH-500 jsonl -> `{"id", "messages", "answer", "solution"}` records."""
    out = []
    for i, r in enumerate(read_records(path)):
        if "problem" not in r or "answer" not in r:
            raise DatasetError(f"{path} record {i} lacks 'problem'/'answer' keys (has {sorted(r)}); is it MATH?")
        out.append(
            {
                "id": str(r.get("unique_id", f"math500-{i}")),
                "messages": [{"role": "user", "content": f"{r['problem']}\n{MATH_INSTRUCTION}"}],
                "answer": str(r["answer"]),
                "solution": r.get("solution", ""),
            }
        )
    return out


def load_generic(path: str) -> list[dict[str, Any]]:
    """Any jsonl/parquet with `messages` or `prompt`/`question`/`problem`, plus `answer`."""
    out = []
    for i, r in enumerate(read_records(path)):
        if "messages" in r:
            messages = r["messages"]
        else:
            text = next((r[k] for k in ("prompt", "question", "problem") if k in r), None)
            if text is None:
                raise DatasetError(
                    f"{path} record {i} has none of 'messages', 'prompt', 'question', 'problem' (has {sorted(r)})"
                )
            messages = [{"role": "user", "content": str(text)}]
        if "answer" not in r:
            raise DatasetError(f"{path} record {i} lacks an 'answer' key (has {sorted(r)})")
        out.append({**r, "id": str(r.get("id", f"rec-{i}")), "messages": messages, "answer": str(r["answer"])})
    return out

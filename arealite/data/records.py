"""Reading dataset records through Hugging Face `datasets`.

`read_dataset(source)` accepts what a user is likely to hold:
- a `datasets.Dataset` (or a `DatasetDict`, of which one split is taken) built in Python;
- a local file `datasets` can read: `.json` / `.jsonl`, `.parquet`, `.csv`, `.arrow`;
- a folder written by `Dataset.save_to_disk` / `DatasetDict.save_to_disk`, or a folder of
  data files (`datasets` infers the format and the splits from the file names);
- a Hugging Face hub name (`openai/gsm8k`) already in the local cache: with
  `HF_HUB_OFFLINE=1` nothing is downloaded.

`read_records` turns the chosen split into a list of dicts. Normalising known datasets to
`{"id", "messages", "answer"}` is `math_datasets.py`'s job; nothing here knows a dataset.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}


class DatasetError(ValueError):
    """A dataset is missing, empty, unreadable or has records of the wrong shape."""


def read_records(source: Any, split: str = "train", subset: str | None = None) -> list[dict[str, Any]]:
    """The records of `source` (see `read_dataset`) as dicts; fails when there are none."""
    dataset = read_dataset(source, split=split, subset=subset)
    if len(dataset) == 0:
        raise DatasetError(f"dataset {_describe(source)} is empty; a training run needs at least one record")
    return dataset.to_list()


def read_dataset(source: Any, split: str = "train", subset: str | None = None):
    """One split of `source` as a `datasets.Dataset`.

    `split` picks among several splits (a hub dataset, a folder of `train`/`test` files, a
    `DatasetDict`); a source with a single split yields it whatever its name. `subset` is
    the hub dataset's configuration name (e.g. "main" for `openai/gsm8k`).
    """
    import datasets

    if isinstance(source, datasets.Dataset):
        return source
    if isinstance(source, datasets.DatasetDict):
        return _pick_split(source, split, "the DatasetDict")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source:
        raise DatasetError(
            f"dataset source {source!r} is neither a path, a hub name nor a datasets.Dataset; "
            "set dataset.path to a local file or folder"
        )
    path = os.path.expanduser(source)
    if os.path.isfile(path):
        return _read_file(path)
    if os.path.isdir(path):
        return _read_folder(path, split)
    if _looks_like_path(source):
        raise DatasetError(
            f"dataset path {source!r} does not exist (cwd: {os.getcwd()}); point dataset.path to a "
            f"{'/'.join(sorted(FILE_BUILDERS))} file, a save_to_disk folder or a folder of data files"
        )
    return _read_hub_cache(source, split, subset)


def _describe(source: Any) -> str:
    return repr(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__


def _looks_like_path(source: str) -> bool:
    """A name the hub could not hold: hub names are `name` or `owner/name`, with no suffix."""
    if source.startswith((".", "/", "~")) or source.count("/") > 1 or os.sep != "/" and os.sep in source:
        return True
    return os.path.splitext(source)[1].lower() in FILE_BUILDERS


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars while loading: every trainer rank loads, and logs are per rank."""
    from datasets.utils import logging as ds_logging

    enabled = ds_logging.is_progress_bar_enabled()
    ds_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            ds_logging.enable_progress_bar()


def _pick_split(splits, split: str, what: str):
    names = list(splits)
    if len(names) == 1:
        return splits[names[0]]
    if split in splits:
        return splits[split]
    raise DatasetError(f"{what} has splits {names} but no {split!r}; set dataset.split to one of them")


def _read_file(path: str):
    import datasets

    suffix = os.path.splitext(path)[1].lower()
    builder = FILE_BUILDERS.get(suffix)
    if builder is None:
        raise DatasetError(
            f"dataset file {path!r} has the suffix {suffix!r}, which datasets cannot read; "
            f"convert it to one of {sorted(FILE_BUILDERS)}"
        )
    if os.path.getsize(path) == 0 or builder == "json" and not _has_content(path):
        raise DatasetError(f"dataset file {path!r} is empty; a training run needs at least one record")
    try:
        with _quiet():
            return datasets.load_dataset(builder, data_files=path, split="train")
    except Exception as e:  # datasets wraps the reader's error; name the file and the line
        where = _first_bad_json_line(path) if builder == "json" else None
        cause = e.__cause__ or e
        raise DatasetError(f"{where or path} is not valid {builder.upper()}: {cause}") from e


def _has_content(path: str) -> bool:
    with open(path, "rb") as f:
        return any(line.strip() for line in f)


def _first_bad_json_line(path: str) -> str | None:
    """`path:N` of the first line that is not JSON (jsonl), for the error message only."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        json.loads(text)  # one JSON document (.json): its own error says where
        return None
    except json.JSONDecodeError:
        pass
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError:
                return f"{path}:{lineno}"
    return None


def _read_folder(path: str, split: str):
    import datasets

    saved = any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json"))
    try:
        with _quiet():
            loaded = datasets.load_from_disk(path) if saved else datasets.load_dataset(path)
    except Exception as e:
        raise DatasetError(
            f"datasets cannot read the folder {path!r} ({type(e).__name__}: {e}); point dataset.path to a "
            "save_to_disk folder, a folder of data files, or one file"
        ) from e
    if isinstance(loaded, datasets.Dataset):
        return loaded
    return _pick_split(loaded, split, f"the folder {path!r}")


def _read_hub_cache(name: str, split: str, subset: str | None):
    import datasets

    try:
        with _quiet():
            loaded = datasets.load_dataset(name, subset)
    except Exception as e:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        raise DatasetError(
            f"dataset {name!r} is not a local file or folder, and loading it as a Hugging Face hub "
            f"dataset{' from the local cache (HF_HUB_OFFLINE is set)' if offline else ''} failed: "
            f"{type(e).__name__}: {str(e)[:300]}. Point dataset.path to a local file or folder, or load "
            "the dataset once where the hub is reachable (then run with HF_HUB_OFFLINE=1)"
        ) from e
    return _pick_split(loaded, split, f"the hub dataset {name!r}")

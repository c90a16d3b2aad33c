"""`train_dataset.path` takes whatever Hugging Face `datasets` reads locally, and the loader
takes a `datasets.Dataset` directly; each form yields the same normalised records, and a bad
source fails with an error naming it and the fix."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

datasets = pytest.importorskip("datasets")

from arealite.config import ConfigError, DatasetConfig  # noqa: E402
from arealite.data.loader import load_records  # noqa: E402
from arealite.data.records import DatasetError, read_dataset  # noqa: E402

ROWS = [
    {"question": "Ann has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "A box holds 1,200 pens; 200 are sold. How many are left?", "answer": "1,000\n#### 1,000"},
    {"question": "What is 6 times 7?", "answer": "#### 42"},
]
EXPECTED = [("7", "Ann has 3 apples"), ("1000", "A box holds"), ("42", "What is 6 times 7")]


def _check_gsm8k(records):
    assert [(r["answer"], r["messages"][0]["content"][: len(q)]) for r, (_, q) in zip(records, EXPECTED)] == EXPECTED
    assert [r["id"] for r in records] == ["gsm8k-0", "gsm8k-1", "gsm8k-2"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """datasets prepares every file it reads in its cache: keep these out of the user's."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets_cache")))


@pytest.fixture()
def rows_dataset():
    return datasets.Dataset.from_list(ROWS)


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet", ".csv", ".arrow"])
def test_every_file_format_gives_the_same_records(tmp_path, rows_dataset, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".json":  # one JSON document holding a list, not lines
        path.write_text(json.dumps(ROWS))
    elif suffix == ".jsonl":
        rows_dataset.to_json(str(path))
    elif suffix == ".parquet":
        rows_dataset.to_parquet(str(path))
    elif suffix == ".csv":
        rows_dataset.to_csv(str(path), index=False)
    else:  # an Arrow stream file, as datasets writes them
        saved = tmp_path / "saved"
        rows_dataset.save_to_disk(str(saved))
        shutil.copy(glob.glob(str(saved / "*.arrow"))[0], path)
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k", path=str(path))))


def test_save_to_disk_folders_and_data_folders(tmp_path, rows_dataset):
    rows_dataset.save_to_disk(str(tmp_path / "one"))
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k", path=str(tmp_path / "one"))))

    # a DatasetDict folder: the caller's split unless dataset.split says otherwise
    held_out = datasets.Dataset.from_list([{"question": "1+1?", "answer": "#### 2"}])
    datasets.DatasetDict({"train": rows_dataset, "test": held_out}).save_to_disk(str(tmp_path / "dict"))
    config = DatasetConfig(type="gsm8k", path=str(tmp_path / "dict"))
    _check_gsm8k(load_records(config))
    assert [r["answer"] for r in load_records(config, split="test")] == ["2"]
    assert [r["answer"] for r in load_records(DatasetConfig(type="gsm8k", path=config.path, split="test"))] == ["2"]

    # a folder of data files: datasets infers splits from the file names
    files = tmp_path / "files"
    files.mkdir()
    rows_dataset.to_json(str(files / "train.jsonl"))
    held_out.to_json(str(files / "test.jsonl"))
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k", path=str(files))))
    assert [r["answer"] for r in load_records(DatasetConfig(type="gsm8k", path=str(files)), split="test")] == ["2"]
    with pytest.raises(DatasetError, match=r"has splits \['train', 'test'\] but no 'validation'; set dataset.split"):
        load_records(DatasetConfig(type="gsm8k", path=str(files), split="validation"))


def test_a_dataset_object_from_python(rows_dataset):
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k"), dataset=rows_dataset))
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k"), dataset=datasets.DatasetDict({"train": rows_dataset})))
    # generic records keep their other columns; nulls of a union schema are dropped
    generic = datasets.Dataset.from_list(
        [
            {"prompt": "2+2?", "question": None, "answer": 4, "level": 1},
            {"prompt": None, "question": "q", "answer": 5, "level": None},
        ]
    )
    recs = load_records(DatasetConfig(type="jsonl"), dataset=generic)
    assert recs[0]["messages"] == [{"role": "user", "content": "2+2?"}] and recs[0]["answer"] == "4"
    assert recs[0]["level"] == 1 and "level" not in recs[1] and recs[1]["messages"][0]["content"] == "q"


def _cache_hub_dataset(cache_root: str, repo_id: str, subset: str, rows_dataset) -> None:
    """Lay out `repo_id` in the datasets cache as a download would: prepared Arrow files
    under <owner>___<name>/<subset>/<version>/<hash>/ (no network here)."""
    from datasets.packaged_modules.json.json import Json

    source = os.path.join(cache_root, "src.jsonl")
    rows_dataset.to_json(source)
    name = repo_id.split("/")[1]
    Json(
        cache_dir=cache_root, dataset_name=name, config_name=subset, hash="0123abcd", data_files={"train": source}
    ).download_and_prepare()
    (config_dir,) = glob.glob(os.path.join(cache_root, name, f"{subset}-*"))
    os.rename(config_dir, os.path.join(cache_root, name, subset))
    os.rename(os.path.join(cache_root, name), os.path.join(cache_root, repo_id.replace("/", "___")))


def test_a_cached_hub_name_offline(tmp_path, rows_dataset, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))  # holds only this dataset
    _cache_hub_dataset(str(tmp_path), "someone/tiny-gsm8k", "main", rows_dataset)
    _check_gsm8k(load_records(DatasetConfig(type="gsm8k", path="someone/tiny-gsm8k", subset="main")))
    with pytest.raises(
        DatasetError, match=r"'someone/absent' is not a local file or folder.*HF_HUB_OFFLINE is set.*HF_HUB_OFFLINE=1"
    ):
        load_records(DatasetConfig(type="gsm8k", path="someone/absent"))


def test_bad_sources_are_named(tmp_path, rows_dataset):
    with pytest.raises(DatasetError, match=r"'.*missing.parquet' does not exist.*point dataset.path"):
        load_records(DatasetConfig(type="gsm8k", path=str(tmp_path / "missing.parquet")))
    with pytest.raises(DatasetError, match=r"'data/none.jsonl' does not exist"):
        read_dataset("data/none.jsonl")  # relative: a path, not a hub name
    odd = tmp_path / "rows.xlsx"
    odd.write_text("x")
    with pytest.raises(DatasetError, match=r"suffix '.xlsx'.*convert it to one of"):
        read_dataset(str(odd))
    with pytest.raises(
        DatasetError, match=r"lacks \['question'\] \(has \['answer', 'rows'\]\); is it GSM8K\? Rename the columns"
    ):
        load_records(DatasetConfig(type="gsm8k"), dataset=rows_dataset.rename_column("question", "rows"))
    with pytest.raises(DatasetError, match=r"lacks \['answer'\].*set dataset.type=jsonl"):
        load_records(DatasetConfig(type="math500"), dataset=datasets.Dataset.from_list([{"problem": "p"}]))
    with pytest.raises(DatasetError, match="is empty"):
        load_records(DatasetConfig(type="jsonl"), dataset=rows_dataset.select([]))
    with pytest.raises(DatasetError, match=r"neither a path, a hub name nor a datasets.Dataset"):
        read_dataset(42)
    with pytest.raises(ConfigError, match="dataset.path is empty"):
        load_records(DatasetConfig(type="gsm8k"))


def test_docs_data_example_runs(capsys):
    """The `datasets.Dataset` example of docs/production.md, taken verbatim, prints what its comment says."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "docs" / "production.md").read_text()
    section = readme.split("## Your data: anything Hugging Face `datasets` reads", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README data example", "exec"), {})
    assert capsys.readouterr().out.startswith("42 What is 6 times 7?")

"""Dataset selection by config and a resumable, rank-sharded data loader."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from arealite.config import ConfigError, DatasetConfig
from arealite.data.arithmetic import make_arithmetic_dataset
from arealite.data.math_datasets import DatasetError, load_generic, load_gsm8k, load_math500
from arealite.data.walk import make_walk_dataset


class RecordDataset(Dataset):
    """A list of dict records as a map-style dataset."""

    def __init__(self, records: list[dict[str, Any]]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]


def load_records(
    config: DatasetConfig, split: str = "train", seed: int = 0, dataset: Any = None
) -> list[dict[str, Any]]:
    """The records a DatasetConfig names, normalised by `config.type`.

    `dataset`, a `datasets.Dataset` (or `DatasetDict`) built in Python, replaces `config.path`.
    `split` is the default split for sources that hold several (`config.split` overrides
    it) and names the split of the synthetic task.
    """
    if config.type == "arithmetic":
        return make_arithmetic_dataset(
            config.num_samples, seed=seed, max_operand=config.max_operand, ops=config.ops, split=split,
            min_operand=config.min_operand, question=config.question,
        )  # fmt: skip
    if config.type == "walk":
        return make_walk_dataset(
            config.num_samples, seed=seed, split=split, median_steps=config.median_steps, max_steps=config.max_steps
        )
    source = dataset if dataset is not None else config.path
    if source is None or isinstance(source, str) and not source:
        raise ConfigError(
            f"dataset.path is empty for dataset.type={config.type!r}; set it to a local file or folder, "
            "or a cached hub name (or pass dataset= a datasets.Dataset)"
        )
    loader = {"gsm8k": load_gsm8k, "math500": load_math500, "jsonl": load_generic}[config.type]
    return loader(source, split=config.split or split, subset=config.subset)


def filter_by_prompt_length(records: list[dict[str, Any]], tokenizer, max_tokens: int) -> list[dict[str, Any]]:
    """Drop records whose chat-formatted prompt exceeds `max_tokens` tokens."""
    kept = []
    for r in records:
        text = tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
        if len(tokenizer.encode(text)) <= max_tokens:
            kept.append(r)
    if not kept:
        raise DatasetError(f"every prompt is longer than max_prompt_tokens={max_tokens}; raise it")
    return kept


def _identity_collate(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return items


def create_dataloader(
    records: list[dict[str, Any]],
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = True,
) -> StatefulDataLoader:
    """A StatefulDataLoader over this rank's shard; each batch is a list of records.

    `batch_size` is the global number of prompts per step; every rank gets
    `batch_size // world_size` of them. The loader's `state_dict()` resumes mid-epoch.
    """
    if batch_size % world_size != 0:
        raise ValueError(f"batch_size={batch_size} must be divisible by world_size={world_size}")
    shard = records[rank::world_size]
    per_rank = batch_size // world_size
    if len(shard) < per_rank:
        raise DatasetError(
            f"rank {rank} holds {len(shard)} records, fewer than its per-rank batch of {per_rank}; "
            "use a larger dataset or a smaller batch_size"
        )
    import torch

    generator = torch.Generator()
    generator.manual_seed(seed)
    return StatefulDataLoader(
        RecordDataset(shard),
        batch_size=per_rank,
        shuffle=shuffle,
        drop_last=drop_last,
        collate_fn=_identity_collate,
        generator=generator,
    )


def train_dataloader(config: Any, tokenizer: Any, rank: int = 0, world_size: int = 1) -> StatefulDataLoader:
    """The training prompts of a GRPOConfig (`train_dataset`, shuffled with `seed`), without
    those over `max_prompt_tokens`, as this rank's loader (`create_dataloader`)."""
    data = config.train_dataset
    records = load_records(data, split="train", seed=config.seed)
    if data.max_prompt_tokens:
        records = filter_by_prompt_length(records, tokenizer, data.max_prompt_tokens)
    return create_dataloader(records, data.batch_size, rank, world_size, data.shuffle, config.seed)

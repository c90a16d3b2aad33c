"""Rollout dumps and offline replay of a training step.

`RolloutDump` (config: `rollout.dump_dir`) writes every trained sample of each step as JSONL;
`python -m arealite.replay DUMP_DIR --step N` re-runs step N's update from that dump and the
run's checkpoint, without servers (see `arealite.replay.__main__`).
"""

from arealite.replay.dump import RolloutDump, dumped_steps, read_batch, read_meta, read_rows

__all__ = ["RolloutDump", "dumped_steps", "read_batch", "read_meta", "read_rows"]

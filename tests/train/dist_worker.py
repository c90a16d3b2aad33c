"""One trainer rank for the multi-process tests (started by `run_ranks` with torchrun's env vars).

    python tests/train/dist_worker.py update|uneven MODEL_DIR OUT_DIR [fused|chunked]
    python tests/train/dist_worker.py sync MODEL_DIR OUT_DIR ADDR1,ADDR2 GROUP_PORT

`update`: one PPO step on this rank's share of a fixed global batch; writes stats and the
updated model (`uneven`: see `train_one_step`; `fused`: no explicit `compute_logp` pass, the
update takes `prox_logp` from its own forward; `chunked`: the LM head in 4-token blocks,
`actor.head_chunk_tokens=4`, where the default leaves these short micro-batches whole).
`sync`: the same step, then a distributed weight upload to the servers at ADDR1,ADDR2 over a
gloo group (rank 0 does the HTTP side), then writes the model.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.request
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from arealite import world
from arealite.config import GenerationHyperparameters, MicroBatchSpec, OptimizerConfig, PPOActorConfig
from arealite.data.packing import select
from arealite.train.actor import PPOActor
from arealite.train.data_parallel import balance_across_ranks
from arealite.types import WeightUpdateMeta
from arealite.utils.stop_ids import banned_stop_ids
from arealite.weight_sync.buckets import broadcast_buckets, weight_buckets
from arealite.weight_sync.distributed import Groups
from tests.train.helpers import make_batch

GLOBAL_LENS = [12, 5, 9, 7, 3, 10, 6, 8]


def train_one_step(
    model_dir: str, uneven: bool = False, fused: bool = False, chunked: bool = False
) -> tuple[PPOActor, dict, dict]:
    """`uneven`: rank 0 holds one group and the last rank the rest, not re-dealt, with more
    micro-batches than rank 0 has sequences (so rank 0 runs zero-weight filler passes)."""
    rank, n_ranks = world.init_distributed()
    torch.set_num_threads(1)
    # Adam's eps bounds how much it amplifies rounding in near-zero gradients (gain lr/eps):
    # 1e-4 keeps the 1-vs-2-rank comparison about the gradients, not float summation order.
    mb_spec = MicroBatchSpec(n_mbs=3, balance_across_ranks=False) if uneven else MicroBatchSpec(n_mbs=2)
    cfg = PPOActorConfig(path=model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-2, eps=1e-4), c_clip=3.0,
                         mb_spec=mb_spec, use_decoupled_loss=True,
                         head_chunk_tokens=4 if chunked else 2048)  # fmt: skip
    actor = PPOActor(cfg, GenerationHyperparameters(group_size=2)).initialize()
    batch = make_batch(GLOBAL_LENS, seed=21)
    batch["rewards"] = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0])
    if not uneven:  # min_new_tokens's stop ban on the first answer tokens of the last rank's rows, which re-dealing
        # moves: every rank replays it (rows of either rank, the LM head chunked on two ranks and whole on one)
        batch["stop_banned"] = stop_banned_rows(batch, model_dir, rows=range(len(GLOBAL_LENS) // 2, len(GLOBAL_LENS)))
    bounds = [0, 2, len(GLOBAL_LENS)] if uneven else [len(GLOBAL_LENS) * r // n_ranks for r in range(n_ranks + 1)]
    if n_ranks == 1:
        bounds = [0, len(GLOBAL_LENS)]
    batch = select(batch, list(range(bounds[rank], bounds[rank + 1])), trim=False)  # whole groups per rank
    if not fused:
        batch["prox_logp"] = actor.compute_logp(batch)
    actor.compute_advantages(batch)
    return actor, actor.ppo_update(batch), batch


def stop_banned_rows(batch: dict, model_dir: str, rows) -> torch.Tensor:
    """`stop_banned` [B, T]: the first 3 loss tokens of `rows` that are not stop ids."""
    loss = batch["loss_mask"].bool()
    stop = torch.isin(batch["input_ids"], torch.tensor(banned_stop_ids(model_dir, [])))
    banned = loss & (loss.int().cumsum(1) <= 3) & ~stop
    keep = torch.zeros_like(banned)
    keep[list(rows)] = True
    return banned & keep


def record_balance(batch: dict, out_dir: str) -> None:
    """Which sequences (by their first token) this rank trains on after re-dealing."""
    share = balance_across_ranks(batch)
    firsts = share["input_ids"][:, 0].tolist()
    Path(out_dir, f"share{world.rank()}.json").write_text(json.dumps({"firsts": firsts,
        "tokens": int(share["attention_mask"].sum())}))  # fmt: skip


def _post(addr: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    if not out.get("success"):
        raise RuntimeError(f"{addr}{path}: {out}")
    return out


def _in_threads(fns) -> tuple[list[threading.Thread], list, list[Exception]]:
    """Threads (not started) running `fns`, their results, and the errors they raise."""
    results, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            results[i] = fn()
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    return threads, results, errors


def sync(actor: PPOActor, addrs: list[str], port: int) -> None:
    meta = WeightUpdateMeta(type="distributed", master_address="127.0.0.1", master_port=port,
                            group_name="test_group", weight_chunk_mb=1, version=1)  # fmt: skip
    group_size = 1 + len(addrs)
    main = world.is_main()
    buckets = weight_buckets(actor.model, actor.compute_dtype, meta.weight_chunk_mb)
    groups = Groups()  # rank 0's end of the group, as WeightSync holds it
    init = [
        lambda a=a, i=i: _post(a, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1 + i, "world_size": group_size,
            "group_name": meta.group_name, "backend": "gloo"})
        for i, a in enumerate(addrs)
    ]  # fmt: skip

    def send_buckets(addr: str) -> None:  # one server's bucket calls, in order, each awaited
        for bucket in buckets:
            _post(addr, "/update_weights_from_distributed", {
                "names": [n for n, _, _ in bucket], "dtypes": [d for _, d, _ in bucket],
                "shapes": [s for _, _, s in bucket], "group_name": meta.group_name, "flush_cache": True,
                "weight_version": str(meta.version)})  # fmt: skip

    for phase in (init, [lambda a=a: send_buckets(a) for a in addrs]):
        threads, _, errors = _in_threads(phase if main else [])
        for t in threads:
            t.start()
        if phase is init:
            if main:
                groups.join(meta, group_size)
        else:
            failure = broadcast_buckets(actor.model, buckets, groups.get(meta.group_name))
            world.barrier()
            assert failure is None, failure
        for t in threads:
            t.join(timeout=120)
        if errors:
            raise errors[0]
    actor.set_version(meta.version)


def main(argv: list[str]) -> None:
    mode, model_dir, out_dir = argv[:3]
    fused = mode != "sync" and argv[3:4] == ["fused"]
    chunked = mode != "sync" and argv[3:4] == ["chunked"]
    actor, stats, batch = train_one_step(model_dir, uneven=mode == "uneven", fused=fused, chunked=chunked)
    os.makedirs(out_dir, exist_ok=True)
    record_balance(batch, out_dir)
    if mode == "sync":
        sync(actor, argv[3].split(","), int(argv[4]))
        if world.is_main():
            Path(out_dir, "buckets.json").write_text(json.dumps(weight_buckets(actor.model, actor.compute_dtype, 1)))
    actor.save(os.path.join(out_dir, "hf"))
    if world.is_main():
        Path(out_dir, "stats.json").write_text(json.dumps(stats))
    world.barrier()
    if world.world_size() > 1:  # a world of one may be a test process that keeps its group
        world.destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1:])

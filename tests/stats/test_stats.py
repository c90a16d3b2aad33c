"""StatsTracker (the one reducer: masked means, weighted micro-batch stats, extrema) against naive loops on
1 and 2 ranks; StatsLogger rows, recovery and plots."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.multiprocessing as mp

from arealite.stats.jsonl import read_stats
from arealite.stats.logger import StatsLogger
from arealite.stats.tracker import StatsTracker


def test_masked_mean_and_extrema_equal_a_naive_loop():
    torch.manual_seed(0)
    tracker = StatsTracker()
    values, masks = [torch.randn(3, 5) for _ in range(3)], [torch.rand(3, 5) > 0.5 for _ in range(3)]
    for v, m in zip(values, masks):
        tracker.masked_mean("x", v, m)
    kept = [float(x) for v, m in zip(values, masks) for x, k in zip(v.flatten(), m.flatten()) if k]
    out = tracker.export()
    assert out["x"] == pytest.approx(sum(kept) / len(kept))
    assert out["x_max"] == pytest.approx(max(kept)) and out["x_min"] == pytest.approx(min(kept))
    assert tracker.export() == {}, "export resets the tracker"


def test_weighted_microbatch_stats_equal_a_naive_loop_and_an_empty_mean_is_nan():
    # The train engine adds each micro-batch's stats weighted by its loss weight (token count).
    torch.manual_seed(1)
    tracker = StatsTracker()
    mbs = [({"loss": float(torch.randn(())), "ratio_max": float(torch.rand(())), "ratio_min": -float(torch.rand(()))},
            float(w)) for w in (3, 1, 7)]  # fmt: skip
    for stats, weight in mbs:
        tracker.add(stats, weight)
    tracker.scalar("never", 1.0, weight=0.0)
    tracker.masked_mean("empty", torch.ones(2), torch.zeros(2, dtype=torch.bool))
    out = tracker.export()
    expected = sum(s["loss"] * w for s, w in mbs) / sum(w for _, w in mbs)
    assert out["loss"] == pytest.approx(expected)
    assert out["ratio_max"] == max(s["ratio_max"] for s, _ in mbs)
    assert out["ratio_min"] == min(s["ratio_min"] for s, _ in mbs)
    assert "ratio_max_max" not in out and "loss_max" not in out  # extrema keys are not means
    assert math.isnan(out["never"]) and math.isnan(out["empty"]) and "empty_max" not in out


def test_mask_shape_mismatch_names_the_stat():
    with pytest.raises(ValueError, match="'reward'"):
        StatsTracker().masked_mean("reward", torch.zeros(4), torch.ones(3, dtype=torch.bool))


def _two_rank_worker(rank: int, port: int, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tracker = StatsTracker()
    # unequal shares: rank 0 holds 1 value, rank 1 holds 3
    tracker.masked_mean("r", torch.tensor([1.0]) if rank == 0 else torch.tensor([2.0, 3.0, 10.0]))
    # rank 0 sees no value of "e": the ranks still reduce the same keys
    tracker.masked_mean("e", torch.tensor([5.0]), torch.tensor([rank == 1]))
    tracker.add({"loss": 1.0 if rank == 0 else 4.0, "w_max": float(rank)}, weight=1.0 if rank == 0 else 2.0)
    out[rank] = tracker.export()
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_ranks_reduce_to_the_global_mean_not_the_mean_of_means():
    from arealite.utils.net import free_ports

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_two_rank_worker, args=(free_ports(1)[0], out), nprocs=2, join=True)
        results = dict(out)
    for rank in (0, 1):
        assert results[rank]["r"] == pytest.approx(16.0 / 4)  # mean of means would be 3.25
        assert results[rank]["r_max"] == 10.0 and results[rank]["r_min"] == 1.0
        assert results[rank]["e"] == 5.0 and results[rank]["e_min"] == 5.0
        assert results[rank]["loss"] == pytest.approx((1.0 + 8.0) / 3) and results[rank]["w_max"] == 1.0


def test_logger_rows_and_recovery_truncation(tmp_path):
    logger = StatsLogger(str(tmp_path), jsonl=True)
    for step in range(4):
        logger.commit(step, {"reward": step / 10, "prompt_ids": [f"p{step}"], "nan": float("nan")})
    logger.close()
    rows = read_stats(str(tmp_path))
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[0]["nan"] is None and rows[2]["prompt_ids"] == ["p2"]

    # a run recovered from the checkpoint of step 1 rewrites steps 2 and 3, keeping the clock
    resumed = StatsLogger(str(tmp_path), jsonl=True)
    resumed.load_state_dict({"elapsed_s": 100.0}, after_step=1)
    resumed.commit(2, {"reward": 0.9})
    resumed.close()
    rows = read_stats(str(tmp_path))
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["reward"] == 0.9 and rows[-1]["elapsed_s"] >= 100.0


def test_only_rank_zero_writes(tmp_path):
    logger = StatsLogger(str(tmp_path / "r1"), rank=1)
    logger.commit(0, {"reward": 1.0})
    logger.close()
    assert not os.path.exists(tmp_path / "r1" / "stats.jsonl")


def test_missing_optional_backends_fail_naming_the_fix(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *a, **kw):
        if name == "wandb":
            raise ImportError("no wandb here")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match="wandb_mode=disabled"):
        StatsLogger(str(tmp_path), wandb_mode="offline")
    with pytest.raises(ValueError, match="wandb_mode='sometimes'"):
        StatsLogger(str(tmp_path), wandb_mode="sometimes")


def test_plot_writes_a_png_with_every_panel(tmp_path):
    pytest.importorskip("matplotlib")
    from arealite.stats.plots import PANELS, _keys_like, main, plot_run

    rows = []
    for step in range(5):
        row = {"step": step, "reward": step / 5, "loss": 1 - step / 5, "logprob_mismatch": 1e-6, "entropy": 0.5,
               "response_len": 2.5, "response_len_max": 4, "truncated_frac": 0.0, "staleness": 1.0, "staleness_max": 2,
               "time/step": 1.0, "time/rollout": 0.5, "time/advantages": 0.01, "dropped_groups": step}  # fmt: skip
        if step % 2 == 0:
            row.update(
                {"eval/version": step, "eval/pass@1": step / 10, "eval/pass@4": step / 5, "eval/maj@4": step / 8}
            )
        rows.append(row)
    with open(tmp_path / "stats.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    # every panel finds its keys in such a run (none would say "not logged")
    for title, _x, ys in PANELS:
        assert any(k in rows[0] or k in rows[2] for y in ys for k in _keys_like(rows, y)), title
    # timings the loop adds later (time/advantages) are drawn without a code change, the total last
    assert _keys_like(rows, "time/*") == ["time/advantages", "time/rollout", "time/step"]
    path = plot_run(str(tmp_path))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main([str(tmp_path / "missing")]) == 2


def test_run_summary_prints_the_closing_lines():
    from arealite.stats.summary import RunSummary

    summary = RunSummary(asynchronous=True, window=2)
    summary.add_eval(0, {"eval/pass@1": 0.25})
    for step in range(3):
        summary.add_step({"entropy": step, "truncated_frac": 0.5, "response_len_p50": 10 * step,
                          "response_len_p95": 20, "mixed_version_frac": step / 4})  # fmt: skip
    summary.add_eval(3, {"eval/pass@1": 0.75})
    assert summary.lines() == [
        "response_len_p50=15.0 response_len_p95=20.0",
        "mixed_version_frac=0.2500",
        "final_entropy=1.5000 truncated_frac=0.5000",
        "eval_accuracy_before=0.2500 eval_accuracy_after=0.7500",
    ]
    assert RunSummary(asynchronous=False).lines() == []

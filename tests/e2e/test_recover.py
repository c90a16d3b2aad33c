"""Recovery acceptance: a trainer killed with SIGKILL mid-step and relaunched continues as if
nothing happened — the same prompts in the same order, and (synchronous rollouts with
per-sample sampling seeds) the same final weights as an uninterrupted run.

The example script runs as one trainer process against a built-in server the test starts;
the kill lands right after the weight sync of step 3, before that step's checkpoint, so the
relaunch must redo step 3 and push the checkpoint's weights to a server that already holds
newer ones. Then the finished run's newest checkpoint is damaged and the run relaunched once
more: it falls back to the previous checkpoint, redoes the last step, and still ends exactly
where the uninterrupted run ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from arealite.server.process import launch_server_process
from tests.e2e.test_reproducible import without_timings
from tests.tolerance import assert_close

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
KILL_AFTER = "[weight-sync] version 4 confirmed"  # step 3 updated and synced, not yet checkpointed
pytestmark = pytest.mark.timeout(400)


def _trainer(model: str, fileroot: Path, trial: str, server_addr: str, *extra: str) -> subprocess.Popen:
    env = {
        **os.environ, "OMP_NUM_THREADS": "1", "AREAL_LLM_SERVER_ADDRS": server_addr,
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }  # fmt: skip
    cmd = [
        sys.executable, str(REPO / "examples" / "gsm8k_grpo.py"), "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
        f"fileroot={fileroot}", "experiment_name=recover", f"trial_name={trial}", f"actor.path={model}",
        f"total_train_steps={STEPS}", "recover.mode=auto", "recover.freq_steps=1",
        "gconfig.sampling_seed=11", "gconfig.group_size=4", "gconfig.max_new_tokens=6",
        "train_dataset.batch_size=4", "train_dataset.num_samples=64",
        "reward_fn=tests.e2e.varied_reward:even_token_fraction", "rollout.max_head_offpolicyness=0",
        "evaluator.freq_steps=0", "stats_logger.plot=false", "stats_logger.progress_bar=false", *extra,
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines() if line.strip()]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


def _kill_mid_step(proc: subprocess.Popen, kill_after: str = KILL_AFTER) -> str:
    seen = []
    for line in proc.stdout:  # type: ignore[union-attr]
        seen.append(line)
        if line.startswith(kill_after):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)[-4000:]
    return "".join(seen)


def test_sigkill_mid_step_then_recover_matches_uninterrupted_run(tmp_path, tiny_model_dir):
    """Also the synchronous half of tests/e2e/test_reproducible.py: before the kill, the crashed run
    is a second fresh run with the reference's seed, and must write the same stats to the last digit."""
    det = ["--skip-server-warmup", "--enable-deterministic-inference"]  # logprobs independent of the batch
    server_a = launch_server_process(tiny_model_dir, extra_args=det)
    server_b = launch_server_process(tiny_model_dir, extra_args=det)
    try:
        reference = _trainer(tiny_model_dir, tmp_path, "uninterrupted", server_a.address)
        crashed = _trainer(tiny_model_dir, tmp_path, "crashed", server_b.address)
        _kill_mid_step(crashed)
        _finish(reference)
        crashed_dir = tmp_path / "recover" / "crashed"
        before_kill = _rows(crashed_dir)
        assert (crashed_dir / "checkpoints" / "latest").read_text() in ("step_2", "step_3")
        resumed_log = _finish(_trainer(tiny_model_dir, tmp_path, "crashed", server_b.address))
        # The finished run's newest checkpoint (after the last step) is damaged: relaunched, the
        # run falls back to the one before and redoes the last step, ending where it ended.
        newest = crashed_dir / "checkpoints" / (crashed_dir / "checkpoints" / "latest").read_text()
        data = newest / "train_state" / "__0_0.distcp"
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        fallback_log = _finish(_trainer(tiny_model_dir, tmp_path, "crashed", server_b.address))
    finally:
        server_a.stop()
        server_b.stop()

    assert "[weight-sync] version 3 confirmed" in resumed_log or "[weight-sync] version 4 confirmed" in resumed_log
    assert f"[recover] skipped damaged checkpoints (step_{STEPS - 1}: train_state/__0_0.distcp has" in fallback_log, (
        fallback_log[-3000:]
    )
    assert f"[weight-sync] version {STEPS} confirmed" in fallback_log  # the last step ran again
    ref_rows, rec_rows = _rows(tmp_path / "recover" / "uninterrupted"), _rows(crashed_dir)
    # two fresh runs with the same seed: the same stats, timings aside, for every step the crashed one logged
    assert len(before_kill) >= 3 and all("logprob_mismatch" in row for row in before_kill), before_kill
    fresh, again = without_timings(ref_rows[: len(before_kill)]), without_timings(before_kill)
    differ = sorted({k for ra, rb in zip(fresh, again) for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k)})
    assert fresh == again, f"two runs with the same seed wrote different stats: {differ}"
    # every step exactly once, with the same prompts in the same order
    assert [r["step"] for r in rec_rows] == list(range(STEPS)), [r["step"] for r in rec_rows]
    assert [r["prompt_ids"] for r in rec_rows] == [r["prompt_ids"] for r in ref_rows]
    ids = [i for r in rec_rows for i in r["prompt_ids"]]
    assert len(ids) == len(set(ids)), "a prompt was trained twice"
    # the same rewards (same samples) and the same final weights
    assert [r["reward"] for r in rec_rows] == [r["reward"] for r in ref_rows]
    # disk weight sync keeps the newest 3 versions (weight_keep_versions), also across the relaunch
    for run_dir in (tmp_path / "recover" / "uninterrupted", crashed_dir):
        assert sorted(os.listdir(run_dir / "weights")) == [f"v{v}" for v in range(STEPS - 2, STEPS + 1)]
    ref_w, rec_w = (
        _weights(tmp_path / "recover" / "uninterrupted" / "weights" / f"v{STEPS}"),
        _weights(crashed_dir / "weights" / f"v{STEPS}"),
    )
    assert ref_w.keys() == rec_w.keys()
    init = _weights(Path(tiny_model_dir))
    assert max((ref_w[k] - init[k]).abs().max().item() for k in init) > 1e-4, "training did not move the weights"
    diff = max((ref_w[k] - rec_w[k]).abs().max().item() for k in ref_w)
    print(f"max |weight difference| recovered vs uninterrupted: {diff}")
    for k in ref_w:  # at most fp32 rounding per step (Adam's steps do not scale with the gradients)
        assert_close(rec_w[k], ref_w[k], n=STEPS * 64, msg=f"recovered run ends {diff} away: {k}")


def test_async_recovery_trains_every_handed_out_prompt_exactly_once(tmp_path, tiny_model_dir):
    """Asynchronous rollouts pull prompts ahead of training; the checkpoint remembers the ones
    handed out but not trained, and the relaunch trains them (none skipped, none twice)."""
    steps = 8
    extra = [f"total_train_steps={steps}", "rollout.max_head_offpolicyness=1"]
    server = launch_server_process(tiny_model_dir, extra_args=["--skip-server-warmup"])
    try:
        _kill_mid_step(
            _trainer(tiny_model_dir, tmp_path, "async", server.address, *extra), "[weight-sync] version 3 confirmed"
        )
        run_dir = tmp_path / "recover" / "async"
        latest = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text()
        pending = [r["id"] for r in torch.load(latest / "rank0.pt", weights_only=False)["dataloader"]["pending"]]
        saved_step = json.loads((latest / "meta.json").read_text())["step"]
        _finish(_trainer(tiny_model_dir, tmp_path, "async", server.address, *extra))
    finally:
        server.stop()
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(steps)), [r["step"] for r in rows]
    ids = [i for r in rows for i in r["prompt_ids"]]
    assert len(ids) == len(set(ids)) == steps * 4, "a prompt was trained twice (or a batch is short)"
    assert pending, "the executor had nothing in flight at the checkpoint: the test proves nothing"
    later = {i for r in rows if r["step"] > saved_step for i in r["prompt_ids"]}
    assert set(pending) <= later, f"prompts in flight at the checkpoint were skipped: {set(pending) - later}"

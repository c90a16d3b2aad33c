"""Every script in benchmarks/ runs end to end in its `--smoke` mode and ends with its figure.

A benchmark nobody runs rots silently (train_packing.py crashed for ten commits). Here each
script runs as a user would start it, with tiny sizes, and its last line must be
`<name>=<finite number>` with the name the README documents. No timing is asserted: the
numbers of a smoke run mean nothing. A new script fails here until it gets an entry in
FIGURES (and a smoke mode).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


BENCHMARKS = REPO / "benchmarks"
HELPERS = {"harness.py", "grpo_step.py", "scale_sides.py"}  # used by the scripts, not run by hand
# script -> the name of its last line (benchmarks/README.md); advantages.py ends with its
# GPU figure when CUDA is visible (the Triton side runs only there)
FIGURES = {
    "advantages.py": "triton_vs_floor" if _cuda_visible() else "reference_vs_loop",
    "async_speedup.py": "async_vs_best_sync_reasoning",
    "deterministic_server.py": "deterministic_throughput_ratio",
    "engines.py": "client_on_vllm_vs_raw",
    "lockstep_schedule.py": "lockstep_vs_interruptible",
    "lora_memory.py": "lora_memory_ratio",
    "memory.py": "head_share_ratio_32k",
    "rollout_overhead.py": "overhead_pct",
    "scale.py": "weight_sync_vs_floor",
    "server_throughput.py": "speedup_vs_sorted_batched_generate",
    "soak.py": "rss_mb_per_1k_requests",
    "time_to_accuracy.py": "async_vs_sync_time_to_accuracy_reasoning",
    "train_packing.py": "packed_speedup_vs_bucketed",
    "turn_credit.py": "turn_loo_vs_turn_index_success",
    "variants.py": "variants_learning",
    "vllm_parity.py": "vllm_parity_max_after_sync",
    "vs_trl.py": "arealite_vs_trl_equal_cores",
}
TAKES_MODEL_PATH = {
    "async_speedup.py",
    "deterministic_server.py",
    "lockstep_schedule.py",
    "rollout_overhead.py",
    "scale.py",
    "server_throughput.py",
    "soak.py",
    "time_to_accuracy.py",
    "train_packing.py",
    "turn_credit.py",
    "variants.py",
    "vs_trl.py",
}
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in HELPERS)


def test_every_script_has_a_documented_figure() -> None:
    missing = [s for s in SCRIPTS if s not in FIGURES]
    assert not missing, (
        f"benchmarks {missing} have no entry in FIGURES: add their last line's name (and a --smoke mode)"
    )
    readme = (BENCHMARKS / "README.md").read_text()
    undocumented = [name for name in FIGURES.values() if name not in readme]
    assert not undocumented, f"figures {undocumented} are not in benchmarks/README.md"


# With the heavy tests (CI time): variants.py's smoke run is a whole launcher run (time_to_accuracy.py's
# two), scale.py's six
# processes across simulated hosts; lora_memory.py, deterministic_server.py and
# lockstep_schedule.py each take about a minute under xdist, and what they run is tested on its own
# (tests/train/test_lora*.py, tests/server/test_deterministic.py, tests/e2e/test_reproducible.py);
# memory.py starts ten measuring processes (the chunked head it measures: tests/train/test_lm_head.py).
# async_speedup.py and vs_trl.py run several launcher-sized arms each (sync and async layouts; TRL
# beside arealite): the suite's time; the loop they time is the one tests/e2e runs. engines.py
# starts a vLLM server (a minute or more) and runs only with vLLM and the real model; vllm_parity.py
# starts one too (on the tiny model), its guarantees are tests/vllm's.
SMOLLM2 = REPO / "runs" / "models" / "smollm2_135m_instruct"  # what configs/smollm2_cpu.yaml builds
HEAVY = {
    "async_speedup.py",
    "vs_trl.py",
    "engines.py",
    "variants.py",
    "time_to_accuracy.py",
    "scale.py",
    "lora_memory.py",
    "memory.py",
    "deterministic_server.py",
    "lockstep_schedule.py",
    "vllm_parity.py",
    "turn_credit.py",  # three in-process trainings, about half a minute; what it runs: tests/train/test_turn_credit*
    # Servers started and loaded for a figure that means nothing at smoke sizes; what they drive is
    # tested on its own (tests/server, tests/rollout, tests/reliability/test_soak.py)
    "server_throughput.py",
    "rollout_overhead.py",
    "soak.py",
}


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.heavy) if s in HEAVY else s for s in SCRIPTS])
def test_smoke_run_prints_its_figure(script: str, tiny_model_dir: str) -> None:
    if script == "vs_trl.py":
        pytest.importorskip("trl", reason="vs_trl.py needs TRL, the benchmark extra: pip install -e .[bench]")
    if script == "engines.py":
        _skip_without_vllm_and_smollm2()
    if script == "vllm_parity.py":
        _skip_without_vllm()
    cmd = [sys.executable, str(BENCHMARKS / script), "--smoke"]
    if script in TAKES_MODEL_PATH:
        cmd += ["--model-path", tiny_model_dir]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout.strip()
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode}:\n{out[-2000:]}\n{proc.stderr[-3000:]}"
    last = out.splitlines()[-1] if out else ""
    match = re.fullmatch(r"(\w+)=(\S+)", last)
    assert match, f"{script}'s last line is {last!r}, not <name>=<number>"
    assert match.group(1) == FIGURES[script], f"{script} ends with {match.group(1)!r}, expected {FIGURES[script]!r}"
    value = match.group(2)
    if script == "variants.py":  # a count of variants: <learning>/<run>
        learning, run = (int(x) for x in value.split("/"))
        assert 0 <= learning <= run > 0, f"{script}'s figure is not a count k/n: {last!r}"
    else:
        assert math.isfinite(float(value)), f"{script}'s figure is not a finite number: {last!r}"


def _skip_without_vllm_and_smollm2() -> None:
    if not (SMOLLM2 / "config.json").is_file():
        pytest.skip(f"engines.py runs the real model: build it with `python -m arealite.tools.smollm2 {SMOLLM2}`")
    _skip_without_vllm()


def _skip_without_vllm() -> None:
    from arealite.backends.vllm_launch import vllm_python
    from tests.vllm.conftest import _vllm_importable

    python = vllm_python()
    if not _vllm_importable(python):
        pytest.skip(f"this benchmark needs vLLM: it is not installed for {python} (README, section vLLM)")

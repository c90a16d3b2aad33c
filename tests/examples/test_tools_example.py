"""examples/tools_grpo.py through the local launcher for 2 steps: it runs, logs its steps and
prints the three accuracies. (The learning figures come from the full config; see benchmarks/README.md.)"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from arealite.config import ConfigError, GRPOConfig, load_config
from arealite.launcher.process import with_package_path

pytestmark = pytest.mark.timeout(300)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO_ROOT, "configs", "tiny_cpu_tools.yaml")


def test_tools_example_runs_two_steps(tmp_path, tool_model_dir):
    overrides = [
        f"fileroot={tmp_path}", f"actor.path={tool_model_dir}", "launcher.setup_commands=[]", "total_train_steps=2",
        "train_dataset.num_samples=64", "train_dataset.batch_size=2", "gconfig.group_size=2",
        "evaluator.num_samples=4", "stats_logger.plot=false",
    ]  # fmt: skip
    env = dict(with_package_path(None), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "arealite.launcher.local", "examples/tools_grpo.py", "--config", CONFIG, *overrides]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280, cwd=REPO_ROOT)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    line = re.search(
        r"accuracy_before=([\d.]+) accuracy_with_tool=([\d.]+) accuracy_without_tool=([\d.]+)", proc.stdout
    )
    assert line and all(0.0 <= float(x) <= 1.0 for x in line.groups()), proc.stdout[-2000:]
    run_dir = load_config(["--config", CONFIG, *overrides], GRPOConfig, script_sections=True).run_dir
    rows = [json.loads(x) for x in open(os.path.join(run_dir, "stats.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1] and all(
        "tool_calls" in r and r["version"] == r["step"] + 1 for r in rows
    )


def _tools_example():
    spec = importlib.util.spec_from_file_location("tools_grpo", os.path.join(REPO_ROOT, "examples", "tools_grpo.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the config subclass's annotations through it
    spec.loader.exec_module(module)
    return module


def test_the_tool_settings_are_the_scripts_own_section(tmp_path):
    """`tool_use` is a section of the script's ToolsGRPOConfig, not of the shared GRPOConfig."""
    config = load_config(["--config", CONFIG, "tool_use.max_turns=2"], _tools_example().ToolsGRPOConfig)
    assert config.tool_use.max_turns == 2 and config.tool_use.tools
    with pytest.raises(ConfigError, match="unknown config key 'tool_use'"):
        load_config(["--config", CONFIG], GRPOConfig)
    with pytest.raises(ConfigError, match="tool_use.max_turns"):
        _tools_example().main(["--config", CONFIG, f"fileroot={tmp_path}", "tool_use.max_turns=0"])


@pytest.mark.parametrize(
    "override, key",
    [
        ("critic.path=m", "critic:"),
        ("ref.path=m", "ref:"),
        ("train_dataset.max_prompt_tokens=64", "train_dataset.max_prompt_tokens=64"),
        ("recover.mode=auto", "recover.mode='auto'"),
        ("evaluator.freq_steps=5", "evaluator.freq_steps=5"),
    ],
)
def test_settings_the_main_example_honours_are_refused_not_ignored(override, key, tmp_path):
    """Each section gsm8k_grpo.py honours and tools_grpo.py does not is a ConfigError naming it,
    raised before anything starts."""
    with pytest.raises(ConfigError, match=re.escape(key)):
        _tools_example().main(["--config", CONFIG, f"fileroot={tmp_path}", override])

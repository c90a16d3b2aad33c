"""The shared server command builder, backend choice, ports and health probe."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys

import pytest

from arealite import backends
from arealite.backends.contract import KEEPALIVE_S
from arealite.config import ConfigError, GRPOConfig, load_config
from arealite.launcher.launch_args import parse_launch_args
from arealite.launcher.server_cmd import model_path, resolve_backend, server_command
from arealite.utils import net


def _config(*overrides: str) -> GRPOConfig:
    return load_config(list(overrides), GRPOConfig)


def test_builtin_command_has_sglang_flag_names():
    cfg = _config("actor.path=/m", "server.random_seed=7", "server.max_running_requests=5", "server.context_length=512")
    cmd = server_command(cfg, "127.0.0.1", 1234, "builtin")
    assert cmd[1:3] == ["-m", "arealite.server"]
    assert cmd[3:] == [
        "--model-path", "/m", "--host", "127.0.0.1", "--port", "1234", "--context-length", "512",
        "--random-seed", "7", "--max-running-requests", "5",
    ]  # fmt: skip


def test_sglang_command_sets_tensor_parallel_dtype_and_extra_args():
    cfg = _config(
        "server.model_path=/srv", "actor.path=/a", "launcher.gpus_per_server=2", "server.dtype=bfloat16",
        "server.extra_args=[--mem-fraction-static,0.8]",
    )  # fmt: skip
    cmd = server_command(cfg, "10.0.0.1", 30000, "sglang", python="python3")
    assert cmd[:5] == ["python3", "-m", "sglang.launch_server", "--tp-size", "2"]
    assert cmd[cmd.index("--model-path") + 1] == "/srv"  # server.model_path wins over actor.path
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert cmd[-2:] == ["--mem-fraction-static", "0.8"]


def test_missing_model_names_both_settings():
    with pytest.raises(ConfigError, match="server.model_path=DIR or actor.path=DIR"):
        model_path(_config())


def test_unknown_backend_is_rejected():
    with pytest.raises(ConfigError, match="'vllm'"):
        server_command(_config("actor.path=/m"), "127.0.0.1", 1, "trtllm")


def test_vllm_command_from_the_config_on_a_cpu(monkeypatch):
    """server.backend=vllm: vLLM's own server from its environment's Python, its RL routes on,
    the server settings in vLLM's flag names; float32 for dtype=auto on a CPU (vLLM's auto is bf16)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", raising=False)
    cfg = _config(
        "actor.path=/m", "server.backend=vllm", "weight_update=disk", "server.vllm_python=/venv/bin/python",
        "server.random_seed=7", "server.max_running_requests=5", "server.context_length=512",
        "server.extra_args=[--max-logprobs,0]",
    )  # fmt: skip
    cmd = server_command(cfg, "127.0.0.1", 1234, resolve_backend(cfg.server))
    env, argv = cmd[: cmd.index("/venv/bin/python")], cmd[cmd.index("/venv/bin/python") :]
    assert env[0] == "env" and "VLLM_SERVER_DEV_MODE=1" in env
    # idle connections kept as long as the rollout client keeps them (vLLM's own default: 5 s)
    assert f"VLLM_HTTP_TIMEOUT_KEEP_ALIVE={int(KEEPALIVE_S)}" in env
    assert argv[:3] == ["/venv/bin/python", "-I", "-c"] and "vllm.entrypoints.openai.api_server" in argv[3]
    assert os.path.isfile(os.path.join(argv[4], "arealite_vllm_worker.py"))  # the worker extension's folder
    flags = {argv[i]: argv[i + 1] for i in range(5, len(argv) - 1) if argv[i].startswith("--")}
    assert flags["--worker-extension-cls"] == "arealite_vllm_worker.ArealiteWorker"
    assert json.loads(flags["--weight-transfer-config"]) == {"backend": "arealite"}  # arealite's engine (vllm_ext)
    assert flags["--model"] == "/m" and flags["--host"] == "127.0.0.1" and flags["--port"] == "1234"
    assert flags["--seed"] == "7" and flags["--max-num-seqs"] == "5" and flags["--max-model-len"] == "512"
    assert flags["--dtype"] == "float32" and flags["--logprobs-mode"] == "processed_logprobs"
    assert "--enable-scale-out" in argv and "--no-enable-chunked-prefill" in argv  # seeds are safe (server_cmd)
    assert argv[-2:] == ["--max-logprobs", "0"]


def test_the_vllm_backend_refuses_what_its_client_cannot_do_in_one_error(monkeypatch, tmp_path):
    """The refusals run once, right after the launcher loads the config (backends.check), and one
    error lists them all."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = _config("actor.path=/m", "server.backend=vllm", "weight_update=distributed")
    assert "--weight-transfer-config" in server_command(backends.check(cfg), "h", 1, "vllm")
    with pytest.raises(ConfigError, match="weight_update=lora is not supported with a vLLM server"):
        backends.check(_config("actor.path=/m", "server.backend=vllm", "weight_update=lora", "actor.lora.rank=4"))
    cfg = _config("actor.path=/m", "server.backend=vllm", "weight_update=distributed", "launcher.gpus_per_server=2")
    with pytest.raises(ConfigError, match="needs launcher.gpus_per_server=1"):
        backends.check(cfg)
    cfg = _config("actor.path=/m", "server.backend=vllm", "weight_update=disk", "server.deterministic=true")
    with pytest.raises(ConfigError, match="server.deterministic=true is not supported with server.backend=vllm"):
        backends.check(cfg)
    script = tmp_path / "train.py"
    script.write_text("")
    overrides = ["actor.path=/m", "server.backend=vllm", "server.deterministic=true", "gconfig.temperature=3.0"]
    with pytest.raises(ConfigError) as info:  # through the launcher's own parsing: one error lists both
        parse_launch_args([str(script), *overrides], "local")
    assert "cannot honour 2 settings" in str(info.value)
    assert "server.deterministic=true" in str(info.value) and "gconfig.temperature=3.0" in str(info.value)


def test_the_names_vllm_ext_registers_are_the_ones_the_launcher_and_client_use():
    """vllm_ext runs in vLLM's environment and cannot be imported here, so the worker extension's and
    the weight-transfer engine's names are written there and in backends/vllm.py; this holds them equal."""
    from arealite.backends import vllm, vllm_launch

    module, cls = vllm.WORKER_EXTENSION.split(".")
    tree = ast.parse(open(os.path.join(vllm_launch.VLLM_EXTENSION_DIR, f"{module}.py")).read())
    names = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if hasattr(t, "id")}
    assert cls in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    assert names["ENGINE_NAME"].value == vllm.TRANSFER_ENGINE


def test_auto_backend_follows_visible_gpus(monkeypatch):
    cfg = _config()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert resolve_backend(cfg.server) == "sglang"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_backend(cfg.server) == "builtin"
    assert resolve_backend(_config("server.backend=sglang").server) == "sglang"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert resolve_backend(_config("server.backend=builtin").server) == "builtin"


def test_free_ports_are_distinct_and_bindable_and_busy_ports_are_not_free():
    chosen = net.free_ports(3)
    assert len(set(chosen)) == 3 and all(net.port_is_free("127.0.0.1", p) for p in chosen)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        assert not net.port_is_free("127.0.0.1", busy)
        assert busy not in net.free_ports(1, exclude={busy})
        assert not net.wait_port_free("127.0.0.1", busy, timeout=0.5)


def test_probe_of_a_closed_port_is_unhealthy():
    port = net.free_ports(1)[0]
    assert not net.probe(f"127.0.0.1:{port}", timeout=1.0)
    assert not net.wait_healthy(f"127.0.0.1:{port}", timeout=1.0, interval=0.2)


def test_free_port_command_prints_a_port_the_sbatch_script_can_bind():
    # sbatch trainer scripts pick MASTER_PORT on the node with this command (launcher/sbatch.py).
    out = subprocess.run([sys.executable, "-m", "arealite.utils.net", "free-port"], capture_output=True, text=True,
                         check=True, timeout=60).stdout  # fmt: skip
    assert 0 < int(out) < 65536 and net.port_is_free("0.0.0.0", int(out))
    from arealite.launcher.sbatch import trainer_script

    script = trainer_script(_config(), "builtin", "/runs/x", "/proj", "/proj/train.py", [])
    assert "-m arealite.utils.net free-port)" in script and "import socket" not in script


def test_launchers_import_no_model_code():
    code = (
        "import sys, arealite.launcher.local, arealite.launcher.server_cmd, arealite.launcher.supervision\n"
        "bad = [m for m in ('torch', 'transformers', 'ray', 'sglang') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_vllm_worker_extension_finds_tied_layers_only():
    """arealite_reload_weights rebuilds the layers whose weight is an earlier layer's tensor (a tied
    head, which vLLM's reload never re-processes), and no other layer."""
    import torch

    from arealite.backends.vllm_ext.arealite_vllm_worker import _tied_layers

    def model(tie: bool) -> torch.nn.Module:
        m = torch.nn.ModuleDict({"embed": torch.nn.Embedding(8, 4), "body": torch.nn.Linear(4, 4)})
        m["head"] = torch.nn.Linear(4, 8, bias=False)
        if tie:
            m["head"].weight = m["embed"].weight
        for layer in m.values():
            layer.quant_method = object()  # vLLM's layers carry one; the rebuild goes through it
        return m

    tied = model(tie=True)
    assert _tied_layers(tied) == [tied["head"]]
    assert _tied_layers(model(tie=False)) == []

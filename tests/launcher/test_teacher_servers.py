"""The local launcher's distillation teacher servers: their command (the servers' backend, the
teacher's model) and their GPUs (after the policy servers' and the trainer's)."""

from __future__ import annotations

import pytest

from arealite.config import ConfigError, GRPOConfig, load_config
from arealite.launcher.local import allocate_gpus, allocate_teacher_gpus
from arealite.launcher.server_cmd import teacher_server_command


def _config(*overrides: str) -> GRPOConfig:
    return load_config(["actor.path=/student", "distill.teacher_path=/teacher", *overrides], GRPOConfig)


def test_teacher_servers_take_the_gpus_after_the_policy_servers_and_trainers(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,4,5,6,7")
    cfg = _config("launcher.n_servers=2", "launcher.n_trainers=1", "distill.n_servers=2")
    assert allocate_gpus(cfg, "sglang") == ([["2"], ["3"]], ["4"])
    assert allocate_teacher_gpus(cfg, "sglang") == [["5"], ["6"]]
    assert allocate_teacher_gpus(cfg, "builtin") is None
    assert allocate_teacher_gpus(_config("distill.address=h:1"), "sglang") is None  # served elsewhere
    with pytest.raises(ConfigError, match="distill.n_servers=3 .* need 3 GPUs beyond the 4"):
        allocate_teacher_gpus(_config("launcher.n_servers=3", "distill.n_servers=3"), "sglang")


@pytest.mark.parametrize("backend, module", [("builtin", "arealite.server"), ("sglang", "sglang.launch_server")])
def test_teacher_server_command_serves_the_teacher_on_the_servers_backend(backend, module):
    cfg = _config("server.extra_args=[--device,cpu]", "server.dtype=bfloat16")
    cmd = teacher_server_command(cfg, "127.0.0.1", 4321, backend, python="py")
    assert cmd[:3] == ["py", "-m", module]
    assert cmd[cmd.index("--model-path") + 1] == "/teacher" and cmd[cmd.index("--port") + 1] == "4321"
    assert cmd[-2:] == ["--device", "cpu"] and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    with pytest.raises(ConfigError, match="no teacher model to serve"):
        teacher_server_command(_config("distill.teacher_path=''", "distill.address=h:1"), "h", 1, backend)

"""The local launcher's distillation teacher servers: their command (the servers' backend, the
teacher's model) and their GPUs (after the policy servers' and the trainer's)."""

from __future__ import annotations

import pytest

from arealite import backends
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


def test_a_vllm_run_refuses_its_teacher_by_name_instead_of_serving_it_elsewhere(monkeypatch):
    """server.backend=vllm: the teacher is refused where the config loads and where the launcher
    would start it, never served by the built-in server in vLLM's place (as it was)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = _config("server.backend=vllm")
    with pytest.raises(ConfigError, match="distill with server.backend=vllm.*no other server stands in for it"):
        backends.check(cfg)
    with pytest.raises(ConfigError, match="distill with server.backend=vllm"):
        teacher_server_command(cfg, "127.0.0.1", 4321, "vllm", python="py")
    backends.check(_config("server.backend=vllm", "distill.teacher_path=''", "distill.address=h:1"))  # served elsewhere


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["gconfig.top_p=0.9"], "distill with top_p / top_k / min_p truncating"),
        (["gconfig.top_k=20", "gconfig.temperature=0.7"], "distill with top_p / top_k / min_p truncating"),
        (["server.backend=sglang", "gconfig.temperature=0.7"], "real SGLang's prompt logprobs are at temperature 1"),
        (["gconfig.top_p=0.9", "gconfig.truncated_logprobs=false"], None),  # full-vocabulary on both sides
        (["gconfig.temperature=0.7"], None),  # the built-in server scores at the student's temperature
    ],
)
def test_a_teacher_that_cannot_score_under_the_students_rule_is_refused(overrides, refused):
    """The teacher's logprobs are compared token by token with the behaviour logprobs: a truncation
    the teacher's server does not apply to prompt logprobs, or real SGLang's temperature-1 prompt
    logprobs, is refused where the config loads and where the teacher client is built."""
    from arealite.rollout.teacher import TeacherClient

    cfg = _config(*overrides)
    if refused is None:
        backends.check(cfg)
        TeacherClient(cfg.distill, cfg.rollout, cfg.gconfig, "/student", ["h:1"])  # nothing contacted yet
        return
    with pytest.raises(ConfigError, match=refused):
        backends.check(cfg)
    if cfg.server.backend != "sglang":  # the client itself cannot tell a real SGLang from the built-in server
        with pytest.raises(ValueError, match=refused):
            TeacherClient(cfg.distill, cfg.rollout, cfg.gconfig, "/student", ["h:1"])

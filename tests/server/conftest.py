"""Fixtures for the built-in server tests: one live server per test module, on loopback."""

from __future__ import annotations

import os

import pytest
import torch

from arealite.server.process import launch_server_process


def make_peaky_model(src: str, dst: str, scale: float = 25.0, seed: int | None = None) -> str:
    """Copy the tiny model with its output layer scaled up (and optionally re-randomized).

    The random tiny model's logits are almost flat (std ~0.16), so greedy choices hinge on
    gaps near float noise; scaling lm_head makes next-token distributions peaked like a
    trained model's, so greedy comparisons test the server, not rounding luck.
    """
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(dst)
    for name in os.listdir(src):
        if name.startswith("tokenizer") or name.endswith(".jinja") or name == "generation_config.json":
            shutil.copy(os.path.join(src, name), dst)
    return dst


@pytest.fixture(scope="session")
def model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with peaked next-token distributions (see make_peaky_model)."""
    return make_peaky_model(tiny_model_dir, str(tmp_path_factory.mktemp("peaky_model")))


def start_server(model_dir: str, log_dir, extra_args: list[str] = ()):
    """A server with one torch thread and a fixed seed; its log goes under `log_dir`."""
    log_path = os.path.join(str(log_dir), f"server-{os.urandom(4).hex()}.log")
    args = ["--random-seed", "1", *extra_args]
    return launch_server_process(model_dir, extra_args=args, env={"OMP_NUM_THREADS": "1"}, log_path=log_path)


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    """A built-in server shared by the modules that leave its weights alone (a module that
    changes weights defines its own `server`)."""
    proc = start_server(model_dir, tmp_path_factory.mktemp("server_logs"))
    try:
        yield proc
    finally:
        proc.stop()
        print(f"server log: {proc.log_path}")


@pytest.fixture(scope="module")
def hf_model(model_dir):
    """The same weights in plain transformers, for reference forwards."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


def reference_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) at each output token from ONE full forward of prompt + output."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    t = 1.0 if temperature < 1e-6 else temperature
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1] / t, dim=-1)
    return lp.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def reference_greedy(model, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """Greedy tokens by re-running the full sequence each step (no cache at all)."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token == eos:
            break
    return ids[len(prompt) :]

"""Fixtures for the built-in server tests: one live server per test module, on loopback."""

from __future__ import annotations

import pytest
import torch

from arealite.server.process import launch_server_process


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """A built-in server on a free port with a fixed seed; stopped after the module."""
    proc = launch_server_process(tiny_model_dir, extra_args=["--random-seed", "1"], env={"OMP_NUM_THREADS": "1"})
    try:
        yield proc
    finally:
        proc.stop()
        print(f"server log: {proc.log_path}")


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    """The same weights in plain transformers, for reference forwards."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
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

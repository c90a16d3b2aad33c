"""A tiny model that has memorized a few tool-calling conversations, served by a built-in server
(session fixtures, registered in tests/conftest.py for the chat and workflow tests).

The random tiny model never emits a well-formed tool call, so the chat client's and the
tool-use workflow's tests use one fine-tuned (seconds of SFT) to answer, greedily:
- "12*34=" with the calculator listed: a calculator call with {"expression": "12*34"};
- the same after the result "408": the answer "408";
- "hi": "hello", without calling anything.
"""

from __future__ import annotations

import pytest

from arealite.config import OptimizerConfig, TrainEngineConfig
from arealite.workflow.tools import Calculator, calculator_demonstrations

CALCULATOR = Calculator().schema()
QUESTION = [{"role": "user", "content": "12*34="}]
GREETING = [{"role": "user", "content": "hi"}]


def train_tool_model(base_dir: str, out_dir: str, max_steps: int = 200) -> str:
    """Fine-tune `base_dir` on the conversations above until it reproduces them; returns `out_dir`."""
    import torch
    from transformers import AutoTokenizer

    from arealite.chat.template import render_prompt
    from arealite.train.engine import FSDPEngine
    from arealite.train.sft import sft_batch, sft_step

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    records = calculator_demonstrations([{"messages": QUESTION, "answer": "408"}], tokenizer)
    records.append({"input_ids": render_prompt(tokenizer, GREETING, [CALCULATOR]), "completion": "hello"})
    batch = sft_batch(records, tokenizer)
    config = TrainEngineConfig(path=base_dir, dtype="float32", optimizer=OptimizerConfig(lr=5e-3))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster than 2 threads on a busy 2-core machine at this size
    try:
        with FSDPEngine(config, total_optimizer_steps=max_steps) as engine:
            for _ in range(max_steps):
                stats = sft_step(engine, batch)
                if stats["loss"] < 0.01:  # every token's probability above ~0.99: greedy decoding reproduces them
                    break
            else:
                raise RuntimeError(f"the tool-calling test model did not memorize its conversations: {stats}")
            engine.save(out_dir)
    finally:
        torch.set_num_threads(threads)
    return out_dir


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    return train_tool_model(tiny_model_dir, str(tmp_path_factory.mktemp("tool_model")))


@pytest.fixture(scope="session")
def tool_engine(tool_model_dir, tmp_path_factory):
    """A built-in server on the tool-calling model and an initialized rollout client on it."""
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.server.process import launch_server_process

    log = tmp_path_factory.mktemp("tool-server-logs") / "server.log"
    args = ["--torch-threads", "1", "--log-level", "warning", "--skip-server-warmup"]
    server = launch_server_process(tool_model_dir, extra_args=args, log_path=str(log))
    try:
        with RemoteSGLangEngine(
            InferenceEngineConfig(setup_timeout=60, request_timeout=60), [server.address]
        ) as engine:
            yield engine
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tool_tokenizer(tool_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model_dir)

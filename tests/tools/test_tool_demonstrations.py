"""Warm-start demonstrations of calling the calculator, and `sft.records_fn` feeding them to SFT."""

import importlib
import os

import pytest
from transformers import AutoTokenizer

from arealite.chat.template import render_prompt
from arealite.workflow.tools import Calculator, calculator_demonstrations

CALLS: list[int] = []  # how many records each call of recording_demonstrations received


def recording_demonstrations(records, tokenizer, config):
    CALLS.append(len(records))
    return calculator_demonstrations(records, tokenizer, config)


def test_demonstrations_follow_the_chat_template(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    record = {"messages": [{"role": "user", "content": "37*58="}], "answer": "2146"}
    call, answer = calculator_demonstrations([record], tok)
    assert (
        call["completion"] == '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*58"}}\n</tool_call>'
    )
    assert answer["completion"] == "2146"
    # prompt + completion + EOS of the call, then the tool turn, is the answer's prompt
    turn = call["input_ids"] + tok.encode(call["completion"]) + [tok.eos_token_id]
    assert tok.decode(answer["input_ids"]).startswith(tok.decode(turn))
    assert (
        tok.decode(answer["input_ids"][len(turn) :])
        == "\n<|im_start|>user\n<tool_response>\n2146\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert call["input_ids"] == render_prompt(tok, record["messages"], [Calculator().schema()])


@pytest.mark.timeout(180)
def test_warm_start_trains_on_records_fn_output(tmp_path, tiny_model_dir):
    from arealite.tools.sft_warmstart import main

    module = "tests.tools.test_tool_demonstrations"
    argv = [f"sft.base_path={tiny_model_dir}", f"actor.path={tmp_path / 'out'}", "sft.steps=2", "sft.batch_size=4",
            f"sft.records_fn={module}:recording_demonstrations", "train_dataset.type=arithmetic",
            "train_dataset.num_samples=16"]  # fmt: skip
    assert main(argv) == 0
    assert importlib.import_module(module).CALLS == [16]
    assert os.path.isfile(tmp_path / "out" / "config.json")

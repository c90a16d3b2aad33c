"""The vLLM server as `backends.vllm_launch.vllm_command` starts it: the routes arealite's client relies on
are on, and the settings it depends on hold (docs/vllm.md §1)."""

from __future__ import annotations


def test_the_rl_routes_are_on_with_processed_logprobs(vllm_server):
    status, info = vllm_server.call("GET", "/server_info?config_format=json")
    assert status == 200, f"/server_info needs VLLM_SERVER_DEV_MODE=1: {status} {info}"
    assert "'logprobs_mode': 'processed_logprobs'" in str(info)
    assert vllm_server.call("GET", "/is_paused") == (200, {"is_paused": False})
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4, "logprobs": 0, "seed": 3}}
    status, reply = vllm_server.call("POST", "/inference/v1/generate", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) == 4

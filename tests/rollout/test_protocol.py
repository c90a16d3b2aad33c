"""Request bodies and reply parsing across the SGLang versions the client must tolerate."""

import math

import pytest

from arealite.backends.contract import clamp_max_new_tokens, error_message, token_versions
from arealite.backends.sglang import generate_body, parse_generate_reply, sampling_params
from arealite.config import GenerationHyperparameters


def _walk(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)
    else:
        yield value


def test_body_has_no_nulls_and_int_tokens():
    g = GenerationHyperparameters(max_new_tokens=32, min_new_tokens=8)
    body = generate_body([1.0, 2, 3], g, 4)  # type: ignore[list-item]
    assert body["input_ids"] == [1, 2, 3] and all(type(t) is int for t in body["input_ids"])
    assert body["sampling_params"]["max_new_tokens"] == 4
    assert body["sampling_params"]["min_new_tokens"] == 4  # never above the remaining budget
    assert body["return_logprob"] is True and body["stream"] is False
    assert None not in list(_walk(body))
    assert "rid" not in body
    # a resubmission after an interruption: tokens already produced count towards the minimum
    assert generate_body([1], g, 20, produced=5)["sampling_params"]["min_new_tokens"] == 3
    assert "min_new_tokens" not in generate_body([1], g, 20, produced=9)["sampling_params"]


def test_sampling_params_sends_each_setting_under_sglangs_name_and_leaves_defaults_out():
    assert sampling_params(GenerationHyperparameters()) == {
        "max_new_tokens": 64, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
    }  # fmt: skip
    g = GenerationHyperparameters(
        max_new_tokens=9, min_new_tokens=2, temperature=0.5, top_p=0.9, top_k=7, stop_token_ids=[5],
        stop=["\n"], frequency_penalty=0.1, sampling_seed=3, min_p=0.05,
    )  # fmt: skip
    params = sampling_params(g)
    assert params == {
        "max_new_tokens": 9, "min_new_tokens": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 7,
        "stop_token_ids": [5], "stop": ["\n"], "frequency_penalty": 0.1, "sampling_seed": 3, "min_p": 0.05,
    }  # fmt: skip
    params["stop"].append("x")  # the body owns its lists
    assert g.stop == ["\n"]
    body = generate_body([1], g, 4)
    assert body["sampling_params"]["max_new_tokens"] == 4 and "processed_logprobs" in body  # top_p/top_k truncate


def test_clamp_to_context():
    assert clamp_max_new_tokens(100, 10, None) == 100
    assert clamp_max_new_tokens(100, 10, 64) == 53
    assert clamp_max_new_tokens(5, 10, 64) == 5
    assert clamp_max_new_tokens(5, 70, 64) == 0


def test_parse_0_5_23_style_reply_with_output_ids():
    reply = {
        "text": "hi",
        "output_ids": [5, 6, 7],
        "meta_info": {
            "id": "abc",
            "finish_reason": {"type": "stop", "matched": 7},
            "weight_version": "3",
            "output_token_logprobs": [[-0.1, 5, None], [None, 6, None], [-0.3, 7, None]],
            "num_retractions": 0,
            "some_future_key": {"x": 1},
        },
    }
    chunk = parse_generate_reply(reply)
    assert chunk.tokens == [5, 6, 7]
    assert chunk.logprobs[0] == -0.1 and chunk.logprobs[1] == -math.inf
    assert chunk.finish_type == "stop" and chunk.server_version == 3
    assert token_versions(chunk, sent_version=3) == [3, 3, 3]
    # without spans the reply's version may be newer than some tokens (a call kept across an
    # in_place sync): never label a token newer than the version the call was sent at
    assert token_versions(chunk, sent_version=2) == [2, 2, 2]
    assert token_versions(chunk, sent_version=5) == [3, 3, 3]  # a server behind the client


def test_parse_old_reply_without_output_ids_and_default_version():
    reply = {
        "text": "x",
        "meta_info": {
            "id": "a",
            "finish_reason": {"type": "length", "length": 2},
            "output_token_logprobs": [[-1.0, 11, None], [-2.0, 12, None]],
        },
    }
    chunk = parse_generate_reply(reply)
    assert chunk.tokens == [11, 12] and chunk.server_version is None
    assert token_versions(chunk, sent_version=9) == [9, 9]


def test_parse_weight_version_spans():
    reply = {
        "output_ids": [1, 2, 3, 4],
        "meta_info": {
            "id": "a",
            "finish_reason": {"type": "length"},
            "weight_version": "2",
            "weight_versions": [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}],
            "output_token_logprobs": [[-1.0, t, None] for t in (1, 2, 3, 4)],
        },
    }
    assert token_versions(parse_generate_reply(reply), sent_version=1) == [1, 1, 2, 2]  # spans are exact


def test_parse_aborts():
    queued = {
        "meta_info": {
            "id": "a",
            "finish_reason": {"type": "abort", "message": "Abort in waiting queue"},
            "completion_tokens": 0,
            "output_token_logprobs": [],
        }
    }
    chunk = parse_generate_reply(queued)
    assert chunk.finish_type == "abort" and chunk.tokens == [] and chunk.error_status is None
    failed = {
        "meta_info": {
            "id": "a",
            "finish_reason": {"type": "abort", "message": "too long", "status_code": 400},
            "output_token_logprobs": [],
        }
    }
    assert parse_generate_reply(failed).error_status == 400


@pytest.mark.parametrize(
    "reply, match",
    [
        ({"text": "x"}, "meta_info"),
        ({"meta_info": {"finish_reason": {"type": "weird"}, "output_token_logprobs": []}}, "finish_reason"),
        ({"meta_info": {"finish_reason": {"type": "stop"}}}, "return_logprob"),
        (
            {
                "output_ids": [1, 2],
                "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": [[0.0, 1, None]]},
            },
            "2 output_ids but 1",
        ),
        ([{}, {}], "list of 2"),
    ],
)
def test_malformed_replies_are_named(reply, match):
    with pytest.raises(ValueError, match=match):
        parse_generate_reply(reply)


def test_error_message_envelopes():
    assert error_message({"error": {"message": "too long"}}) == "too long"
    assert error_message({"error": "unknown field `foo`"}) == "unknown field `foo`"
    assert error_message({"object": "error", "message": "bad", "code": 400}) == "bad"
    assert error_message({"success": False, "message": "no weights"}) == "no weights"
    assert error_message("Internal Server Error") == "Internal Server Error"


@pytest.mark.parametrize(
    "adapter, wrong, right",
    [("vllm", [None, "joint"], "sequential"), ("sglang", ["sequential"], "joint")],
)
def test_an_adapter_refuses_a_truncation_rule_its_server_does_not_truncate_by(adapter, wrong, right):
    """The trainer replays gconfig.truncation_rule, whatever built the objects: each backend's
    adapter refuses a gconfig whose rule is not its server's when the rule matters."""
    from arealite.backends.sglang import SGLangProtocol
    from arealite.backends.vllm import VLLMProtocol

    server = VLLMProtocol() if adapter == "vllm" else SGLangProtocol()
    for rule in wrong:
        g = GenerationHyperparameters(temperature=0.7, top_p=0.8, top_k=20, truncation_rule=rule)
        with pytest.raises(ValueError, match=rf"gconfig.truncation_rule={rule!r}.*set gconfig.truncation_rule="):
            server.generate_body([1, 2], g, 4)
        # the rule does not matter when nothing truncates, or for greedy rows
        server.generate_body([1, 2], GenerationHyperparameters(temperature=0.7, truncation_rule=rule), 4)
        server.generate_body([1, 2], GenerationHyperparameters(temperature=0.0, top_k=20, truncation_rule=rule), 4)
    server.generate_body([1, 2], GenerationHyperparameters(temperature=0.7, top_p=0.8, truncation_rule=right), 4)


def test_the_old_module_paths_import_the_same_objects_for_one_release():
    """rollout/protocol.py, vllm_protocol.py, remote_sglang.py and remote_vllm.py are import shims
    (docs/CHANGELOG.md): user code importing from them gets the moved objects themselves."""
    from arealite.backends import sglang, vllm
    from arealite.rollout import client, protocol, remote_sglang, remote_vllm, vllm_protocol

    assert protocol.SGLangProtocol is sglang.SGLangProtocol and protocol.generate_body is sglang.generate_body
    assert vllm_protocol.VLLMProtocol is vllm.VLLMProtocol and vllm_protocol.RELOAD_METHOD == vllm.RELOAD_METHOD
    assert remote_sglang.RemoteSGLangEngine is client.RolloutClient
    assert (
        remote_vllm.RemoteVLLMEngine is client.RemoteVLLMEngine and remote_vllm.rollout_client is client.rollout_client
    )
    with pytest.raises(ValueError, match="gconfig.temperature=3.0 is above vLLM's limit"):
        vllm_protocol.check_gconfig(GenerationHyperparameters(temperature=3.0))

"""Every endpoint and every error case of the SGLang protocol, against one live server."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.tolerance import close

pytestmark = pytest.mark.timeout(180)
EOS = 514
CONTEXT = 1024  # the tiny model's max_position_embeddings


def gen(server, **body):
    body.setdefault("input_ids", [5, 6, 7])
    return server.post("/generate", body)


# ---- info and health ----------------------------------------------------------------------
def test_health_and_info_routes(server, model_dir):
    assert server.get("/health")[0] == 200
    assert server.get("/health_generate")[0] == 200
    assert server.get("/ready")[0] == 200
    for path in ("/get_model_info", "/model_info"):
        status, info = server.get(path)
        assert status == 200
        assert info["model_path"] == model_dir and info["is_generation"] is True
        assert info["weight_version"] == "default" and info["architectures"] == ["Qwen2ForCausalLM"]
    for path in ("/get_server_info", "/server_info"):
        status, info = server.get(path)
        assert status == 200 and info["context_length"] == CONTEXT and "internal_states" in info
        assert info["random_seed"] == 1
        assert info["model_impl"] == "arealite"  # `auto` takes the lean forward for a Qwen2 model
    status, models = server.get("/v1/models")
    assert status == 200 and models["object"] == "list"
    assert models["data"][0]["id"] == model_dir and models["data"][0]["max_model_len"] == CONTEXT


def test_unknown_routes_are_404(server):
    assert server.get("/nope") == (404, {"detail": "Not Found"})
    assert server.get("/get_weight_version")[0] == 404  # removed in 0.5.22+


def test_flush_cache_when_idle(server):
    for method in ("GET", "POST"):
        status, text = server.request(method, "/flush_cache")
        assert status == 200 and text.startswith("Cache flushed.")


# ---- generate forms -----------------------------------------------------------------------
def test_text_prompt_and_stop_trimming(server):
    status, out = gen(
        server, input_ids=None, text="What is 1 + 2?", sampling_params={"max_new_tokens": 8, "temperature": 0}
    )
    assert status == 200 and out["meta_info"]["prompt_tokens"] > 0
    # A stop string taken from the greedy text must stop there and be cut from `text` only.
    full = gen(
        server, input_ids=[9, 8, 7], sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    )[1]
    stop = full["text"][4:6]
    assert stop.strip(), full["text"]
    out = gen(
        server,
        input_ids=[9, 8, 7],
        sampling_params={"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop]},
    )[1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and full["text"].startswith(out["text"])
    kept = gen(
        server,
        input_ids=[9, 8, 7],
        sampling_params={
            "max_new_tokens": 24,
            "temperature": 0,
            "ignore_eos": True,
            "stop": stop,
            "no_stop_trim": True,
        },
    )[1]
    assert kept["text"].endswith(stop) or stop in kept["text"]
    assert kept["output_ids"] == out["output_ids"]


def test_stop_token_ids_and_min_new_tokens(server):
    full = gen(server, sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True})[1]["output_ids"]
    target = full[3]
    first = full.index(target)
    out = gen(
        server, sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True, "stop_token_ids": [target]}
    )[1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": target}
    assert out["output_ids"] == full[: first + 1]  # the stop token stays in output_ids
    # min_new_tokens bans stop tokens until reached.
    out = gen(
        server, sampling_params={"max_new_tokens": 10, "min_new_tokens": 10, "temperature": 0, "stop_token_ids": full}
    )[1]
    assert len(out["output_ids"]) == 10 and out["meta_info"]["finish_reason"]["type"] == "length"


def test_generate_accepts_put(server):
    status, out = server.request("PUT", "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 2


def test_max_new_tokens_zero_and_default(server):
    out = gen(server, sampling_params={"max_new_tokens": 0})[1]
    assert out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    out = gen(server, input_ids=[1] * (CONTEXT - 5), sampling_params={"temperature": 0, "ignore_eos": True})[1]
    assert out["meta_info"]["completion_tokens"] == 5  # default 128, capped by the context left


def test_batch_forms_and_rids(server):
    status, outs = gen(
        server, input_ids=[[1, 2], [3, 4, 5]], rid="job", sampling_params=[{"max_new_tokens": 2}, {"max_new_tokens": 3}]
    )
    assert status == 200 and [o["meta_info"]["id"] for o in outs] == ["job_0", "job_1"]
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [2, 3]
    status, outs = gen(
        server, input_ids=None, text=["a b", "c d"], rid=["x", "y"], sampling_params={"max_new_tokens": 1}
    )
    assert [o["meta_info"]["id"] for o in outs] == ["x", "y"]
    status, outs = gen(
        server, input_ids=[[1, 2], [3, 4]], return_logprob=[True, False], sampling_params={"max_new_tokens": 2}
    )
    assert "output_token_logprobs" in outs[0]["meta_info"] and "output_token_logprobs" not in outs[1]["meta_info"]


def test_parallel_sampling_n(server):
    status, outs = gen(
        server, input_ids=[[1, 2], [3, 4]], rid="r", sampling_params={"max_new_tokens": 6, "n": 3, "temperature": 1.0}
    )
    assert status == 200 and len(outs) == 6
    assert len({o["meta_info"]["id"] for o in outs}) == 6 and all(
        not o["meta_info"]["id"].startswith("r") for o in outs
    )
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [2] * 6
    assert len({tuple(o["output_ids"]) for o in outs[:3]}) > 1  # independent samples


def test_seeded_sampling_and_greedy_threshold(server):
    body = {"max_new_tokens": 12, "temperature": 1.0, "sampling_seed": 7, "ignore_eos": True}
    a = gen(server, sampling_params=body)[1]["output_ids"]
    assert gen(server, sampling_params=body)[1]["output_ids"] == a
    assert gen(server, sampling_params={**body, "sampling_seed": 8})[1]["output_ids"] != a
    greedy = gen(server, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})[1]
    tiny_t = gen(server, sampling_params={"max_new_tokens": 12, "temperature": 1e-7, "ignore_eos": True})[1]
    assert tiny_t["output_ids"] == greedy["output_ids"]


def test_truncation_knobs_change_sampling(server):
    top1 = gen(server, sampling_params={"max_new_tokens": 8, "top_k": 1, "temperature": 1.0, "ignore_eos": True})[1][
        "output_ids"
    ]
    greedy = gen(server, sampling_params={"max_new_tokens": 8, "temperature": 0, "ignore_eos": True})[1]["output_ids"]
    assert top1 == greedy
    tiny_p = gen(server, sampling_params={"max_new_tokens": 8, "top_p": 1e-6, "temperature": 1.0, "ignore_eos": True})[
        1
    ]["output_ids"]
    assert tiny_p == greedy
    full_min_p = gen(
        server, sampling_params={"max_new_tokens": 8, "min_p": 1.0, "temperature": 1.0, "ignore_eos": True}
    )[1]["output_ids"]
    assert full_min_p == greedy


def test_penalties_discourage_repeats(server):
    plain = gen(server, sampling_params={"max_new_tokens": 30, "temperature": 0, "ignore_eos": True})[1]["output_ids"]
    pen = gen(
        server,
        sampling_params={
            "max_new_tokens": 30,
            "temperature": 0,
            "ignore_eos": True,
            "frequency_penalty": 2.0,
            "presence_penalty": 2.0,
        },
    )[1]["output_ids"]
    assert len(set(plain)) < len(plain), "the tiny model repeats itself greedily"
    assert len(set(pen)) > len(set(plain))


def test_logit_bias_and_skip_special_tokens(server):
    forced = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True, "logit_bias": {str(EOS): 100.0}}
    out = gen(server, sampling_params=forced)[1]
    assert out["output_ids"] == [EOS] * 3 and out["text"] == ""
    out = gen(server, sampling_params={**forced, "skip_special_tokens": False})[1]
    assert out["text"] == "<|im_end|>" * 3
    # Without ignore_eos the forced EOS stops at once; output_ids keep it, text drops it.
    out = gen(server, sampling_params={**forced, "ignore_eos": False, "skip_special_tokens": False})[1]
    assert (
        out["output_ids"] == [EOS]
        and out["text"] == ""
        and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS}
    )


def test_top_logprobs_and_text_in_logprobs(server):
    out = gen(
        server,
        return_logprob=True,
        top_logprobs_num=3,
        return_text_in_logprobs=True,
        sampling_params={"max_new_tokens": 4, "temperature": 0},
    )[1]
    meta = out["meta_info"]
    assert len(meta["output_top_logprobs"]) == 4 and all(len(pos) == 3 for pos in meta["output_top_logprobs"])
    for pos, chosen in zip(meta["output_top_logprobs"], meta["output_token_logprobs"]):
        assert pos[0][1] == chosen[1] and close(pos[0][0], chosen[0], n=64)  # greedy picks the top one
        assert pos[0][0] >= pos[1][0] >= pos[2][0]
    assert all(isinstance(t[2], str) for t in meta["output_token_logprobs"])
    out = gen(server, return_logprob=True, logprob_start_len=0, sampling_params={"max_new_tokens": 1})[1]
    inputs = out["meta_info"]["input_token_logprobs"]
    assert [t[1] for t in inputs] == [5, 6, 7] and inputs[0][0] is None and all(t[0] < 0 for t in inputs[1:])


def test_stream_chunks(server):
    body = {
        "input_ids": [[1, 2], [3, 4]],
        "stream": True,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
    }
    status, text = server.post("/generate", body)
    assert status == 200
    lines = [line for line in text.split("\n\n") if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    for index in (0, 1):
        mine = [c for c in chunks if c["index"] == index]
        assert [len(c["output_ids"]) for c in mine] == [1, 2, 3, 4]  # cumulative
        assert [c["meta_info"]["finish_reason"] for c in mine[:-1]] == [None] * 3
        assert mine[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert len(mine[-1]["meta_info"]["output_token_logprobs"]) == 4


# ---- errors -----------------------------------------------------------------------------------
def _is_message_error(reply, fragment: str) -> bool:
    status, body = reply
    return status == 400 and fragment in body["error"]["message"]


def test_value_errors_are_400_with_message(server):
    assert _is_message_error(
        server.post("/generate", {"sampling_params": {}}), "Either text, input_ids or input_embeds"
    )
    assert _is_message_error(gen(server, input_ids=[]), "input_ids cannot be empty")
    assert _is_message_error(gen(server, sampling_params={"top_p": 0}), "top_p must be in (0, 1]")
    assert _is_message_error(gen(server, sampling_params={"temperature": -1}), "temperature")
    assert _is_message_error(gen(server, sampling_params={"top_k": 0}), "top_k")
    assert _is_message_error(gen(server, sampling_params={"frequency_penalty": 3}), "frequency_penalty")
    assert _is_message_error(gen(server, sampling_params={"max_new_tokens": -1}), "max_new_tokens")
    assert _is_message_error(gen(server, sampling_params={"min_new_tokens": 5, "max_new_tokens": 2}), "min_new_tokens")
    assert _is_message_error(
        gen(server, input_ids=[1] * CONTEXT), f"longer than the model's context length ({CONTEXT} tokens)"
    )
    assert _is_message_error(
        gen(server, input_ids=[1] * 1000, sampling_params={"max_new_tokens": 25}),
        "You requested a total of 1025 tokens",
    )
    assert _is_message_error(gen(server, input_ids=[1, 100000]), "outside the vocabulary")
    assert _is_message_error(gen(server, input_ids=[[1], [2]], rid=["a"]), "rids length mismatch")
    assert _is_message_error(
        gen(server, input_ids=[[1], [2]], return_logprob=[True, True], sampling_params={"n": 2}),
        "Cannot use list return_logprob",
    )
    assert _is_message_error(gen(server, logprob_start_len=3), "logprob_start_len")
    assert (
        gen(server, input_ids=[1, 2], sampling_params={"max_new_tokens": 24})[0] == 200
    )  # exactly at the limit is fine


def test_contract_errors_are_400_with_plain_string(server):
    for bad in (
        {"sampling_params": {"foo": 1}},
        {"sampling_params": {"max_new_tokens": 8.0}},
        {"input_ids": [1.5, 2]},
        {"sampling_params": {"ignore_eos": 1}},
        {"stream": "yes"},
    ):
        status, body = gen(server, **bad)
        assert status == 400 and isinstance(body["error"], str), (bad, body)
    assert "unknown field `foo`" in gen(server, sampling_params={"foo": 1})[1]["error"]
    assert gen(server, sampling_params={"top_k": None, "max_new_tokens": 2})[0] == 200  # null means default


def test_bad_bodies_are_400_object_error(server):
    for path in (
        "/generate",
        "/pause_generation",
        "/continue_generation",
        "/abort_request",
        "/update_weights_from_disk",
    ):
        status, body = server.post(path, b"{not json")
        assert status == 400 and body["object"] == "error" and body["code"] == 400, (path, body)
    status, body = server.post("/pause_generation", b"")  # 0.5.6+: the body is required
    assert status == 400 and body["type"] == "Bad Request"
    status, body = server.post("/pause_generation", {"mode": "sideways"})
    assert status == 400 and "mode" in body["message"]
    status, body = server.post("/update_weights_from_disk", {})
    assert status == 400 and "model_path" in body["message"]


def test_stream_errors_arrive_in_band(server):
    status, text = server.post("/generate", {"input_ids": [1] * CONTEXT, "stream": True})
    assert status == 200
    first, done = [line for line in text.split("\n\n") if line]
    assert json.loads(first[6:])["error"]["code"] == 400 and done == "data: [DONE]"
    status, body = server.post("/generate", {"input_ids": [1], "stream": True, "sampling_params": {"foo": 1}})
    assert status == 400 and isinstance(body["error"], str)  # the contract check runs before the stream


def _wait_running(server, n: int = 1) -> None:
    while server.get("/get_server_info")[1]["internal_states"][0]["num_running"] < n:
        time.sleep(0.01)


def test_duplicate_rid_while_active(server):
    from concurrent.futures import ThreadPoolExecutor

    long = {
        "input_ids": [1, 2],
        "rid": "dup",
        "sampling_params": {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0},
    }
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(server.post, "/generate", long)
        _wait_running(server)
        status, body = server.post("/generate", {**long, "sampling_params": {"max_new_tokens": 1}})
        assert status == 400 and "Duplicate request ID detected: dup" in body["error"]["message"]
        server.post("/abort_request", {"rid": "dup"})
        assert first.result(60)[1]["meta_info"]["finish_reason"]["type"] == "abort"


def test_abort_request_by_rid(server):
    from concurrent.futures import ThreadPoolExecutor

    long = {
        "input_ids": [1, 2],
        "rid": "victim",
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 900, "ignore_eos": True},
    }
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(server.post, "/generate", long)
        _wait_running(server)
        assert server.post("/abort_request", {"rid": "victim"}) == (200, "")
        status, out = future.result(60)
    meta = out["meta_info"]
    assert status == 200 and meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < len(out["output_ids"]) < 900 and len(meta["output_token_logprobs"]) == len(out["output_ids"])
    assert server.post("/abort_request", {"rid": "nobody"})[0] == 200


def test_abort_all(server):
    from concurrent.futures import ThreadPoolExecutor

    long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(server.post, "/generate", long) for _ in range(3)]
        _wait_running(server, 3)
        assert server.post("/abort_request", {"abort_all": True}) == (200, "")
        outs = [f.result(60)[1] for f in futures]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" and len(o["output_ids"]) < 900 for o in outs)


def test_server_still_serves_after_errors(server):
    status, out = gen(server, sampling_params={"max_new_tokens": 3})
    assert status == 200 and out["meta_info"]["completion_tokens"] == 3
    assert server.get("/health")[0] == 200


def test_client_disconnect_aborts_generation(server):
    """A non-stream client that gives up (timeout) cancels its generation server-side (docs/protocol.md §1.7)."""
    # A 64-prompt batch of 1,000 tokens each takes seconds; the server checks its client every 0.25 s.
    body = {"input_ids": [[1, i] for i in range(64)], "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}
    steps = server.get("/get_server_info")[1]["internal_states"][0]["decode_steps"]
    payload = json.dumps(body).encode()
    with socket.create_connection((server.host, server.port)) as sock:
        head = (
            f"POST /generate HTTP/1.1\r\nHost: {server.address}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        sock.sendall(head.encode() + payload)
        _wait_running(server)
    # The socket is closed: the client is gone.
    while (state := server.get("/get_server_info")[1]["internal_states"][0])["num_running"] > 0:
        time.sleep(0.05)
    assert state["decode_steps"] - steps < 999, "the abandoned request ran to the end"

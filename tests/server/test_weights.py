"""Weight updates on a live server: over torch.distributed (gloo) from a separate trainer
process, and from disk; versions, abort_all_requests, the update/in-flight lock, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from arealite.launcher.process import with_package_path
from arealite.utils.net import free_ports
from tests.server.conftest import make_peaky_model, start_server

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 6, 7], [100, 200, 300, 400], [42], [7, 7, 7, 7, 7, 7, 7]]
# Long enough to still run when the next call arrives, however fast the server decodes
# (the lean forward takes well under a millisecond per step of the tiny model).
LONG = 1000  # the tiny model's context is 1024

# The trainer side: rank 0 of the weight-update group broadcasts every tensor of the new
# checkpoint in two buckets, in the order the server is told.
TRAINER = textwrap.dedent(
    """
    import sys, torch
    from transformers import AutoModelForCausalLM
    from arealite.weight_sync.group import init_custom_process_group, broadcast, release_store
    path, port, group = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    pg = init_custom_process_group("gloo", "127.0.0.1", port, 0, 2, group, timeout=120)
    for name, tensor in model.state_dict().items():
        broadcast(pg, tensor.contiguous(), src=0)
    # The group before its store, as WeightSync.close() does: left to interpreter teardown,
    # the store could go first and gloo's threads abort the process (seen once in CI: SIGABRT).
    del pg
    release_store(group)
    print("trainer done", flush=True)
    """
)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """This module changes the served weights, so it gets a server of its own."""
    with start_server(model_dir, tmp_path_factory.mktemp("server_logs")) as proc:
        yield proc


@pytest.fixture(scope="module")
def new_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    return make_peaky_model(tiny_model_dir, str(tmp_path_factory.mktemp("new_weights")), seed=5)


def greedy(server, n: int = 16) -> list[list[int]]:
    body = {"input_ids": PROMPTS, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    status, outs = server.post("/generate", body)
    assert status == 200, outs
    return [o["output_ids"] for o in outs]


def _specs(model_dir: str) -> list[tuple[str, str, list[int]]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in model.state_dict().items()]


def test_distributed_update_equals_fresh_server(server, new_model_dir, tmp_path):
    before = greedy(server)
    port, group = free_ports(1)[0], "weight_update_group"
    env = with_package_path(None) | {"OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, new_model_dir, str(port), group],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        init = {
            "master_address": "127.0.0.1",
            "master_port": str(port),
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group,
            "backend": "gloo",
        }
        assert server.post("/init_weights_update_group", init, timeout=120) == (
            200,
            {"success": True, "message": "Succeeded to initialize custom process group."},
        )
        specs = _specs(new_model_dir)
        half = len(specs) // 2
        for i, bucket in enumerate((specs[:half], specs[half:])):
            body = {
                "names": [s[0] for s in bucket],
                "dtypes": [s[1] for s in bucket],
                "shapes": [s[2] for s in bucket],
                "group_name": group,
                "flush_cache": True,
                "abort_all_requests": True,
            }
            if i == 1:
                body["weight_version"] = "v1"
            status, reply = server.post("/update_weights_from_distributed", body, timeout=120)
            assert status == 200 and reply["success"], reply
        assert reply["message"] == "Succeeded to update parameter online. Weight version updated to v1."
        assert trainer.wait(60) == 0
    finally:
        if trainer.poll() is None:
            trainer.kill()
        print(trainer.stdout.read())
    after = greedy(server)
    assert after != before
    with start_server(new_model_dir, tmp_path) as fresh:
        assert greedy(fresh) == after
    assert server.get("/get_model_info")[1]["weight_version"] == "v1"
    status, out = server.post("/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}})
    assert out["meta_info"]["weight_version"] == "v1"
    assert server.post("/destroy_weights_update_group", {"group_name": group}) == (
        200,
        {"success": True, "message": "Succeeded to destroy custom process group."},
    )
    assert server.post("/destroy_weights_update_group", {"group_name": group}) == (
        400,
        {"success": False, "message": "The group to be destroyed does not exist."},
    )


def test_distributed_errors(server):
    body = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[515, 64]], "group_name": "missing"}
    status, reply = server.post("/update_weights_from_distributed", body)
    assert status == 400 and reply["success"] is False and "init_weights_update_group" in reply["message"]
    status, reply = server.post("/update_weights_from_distributed", {**body, "dtypes": ["floatish"]})
    assert status == 400
    status, reply = server.post("/update_weights_from_distributed", {**body, "load_format": "flattened_bucket"})
    assert status == 400 and "load_format" in reply["message"]
    init = {
        "master_address": "127.0.0.1",
        "master_port": free_ports(1)[0],
        "rank_offset": 1,
        "world_size": 2,
        "backend": "mpi-ish",
    }
    status, reply = server.post("/init_weights_update_group", init)
    assert status == 400 and reply["message"].startswith("Failed to initialize custom process group")
    assert server.post("/init_weights_update_group", {"master_address": "127.0.0.1"})[0] == 400


def test_disk_update_version_and_failure(server, model_dir, hf_model):
    from tests.server.conftest import reference_greedy

    status, reply = server.post("/update_weights_from_disk", {"model_path": model_dir, "weight_version": "v2"})
    assert status == 200 and reply == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to v2.",
        "num_paused_requests": 0,
    }
    outs = greedy(server)
    assert outs[0] == reference_greedy(hf_model, PROMPTS[0], 16)
    assert server.get("/get_model_info")[1]["weight_version"] == "v2"
    status, reply = server.post("/update_weights_from_disk", {"model_path": "/nonexistent/ckpt"})
    assert status == 400 and reply["success"] is False and reply["message"].startswith("Failed to get weights iterator")
    assert greedy(server) == outs  # the served weights are untouched after a failed update
    assert server.get("/get_model_info")[1]["weight_version"] == "v2"


def test_update_waits_for_in_flight_or_aborts_them(server, model_dir):
    long = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        # Without a pause or abort, an update waits until in-flight requests finish (write lock).
        before = server.get("/get_model_info")[1]["weight_version"]
        assert before != "v3"
        future = pool.submit(server.post, "/generate", long)
        _wait_running(server)
        status, reply = server.post("/update_weights_from_disk", {"model_path": model_dir, "weight_version": "v3"})
        assert status == 200
        # the whole answer came from the old weights: the update waited for it (the client
        # thread may still be reading that reply when the update's arrives, so no done() check)
        out = future.result(timeout=60)[1]
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert [s["version"] for s in out["meta_info"]["weight_versions"]] == [before]
        # abort_all_requests answers the in-flight request with its partial output first.
        future = pool.submit(server.post, "/generate", long)
        _wait_running(server)
        body = {"model_path": model_dir, "weight_version": "v4", "abort_all_requests": True}
        assert server.post("/update_weights_from_disk", body)[0] == 200
        out = future.result(60)[1]
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and len(out["output_ids"]) < LONG


def _wait_running(server) -> None:
    while server.get("/get_server_info")[1]["internal_states"][0]["num_running"] < 1:
        time.sleep(0.01)


def test_flush_refused_while_requests_are_paused_in_place(server, model_dir):
    long = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": LONG, "temperature": 0, "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(server.post, "/generate", long)
        _wait_running(server)
        assert server.post("/pause_generation", {"mode": "in_place"})[0] == 200
        try:
            assert server.get("/flush_cache")[0] == 400
            status, reply = server.post("/update_weights_from_disk", {"model_path": model_dir})
            assert status == 400 and "cache was not flushed" in reply["message"]  # 0.5.22+ (weights loaded)
            status, reply = server.post("/update_weights_from_disk", {"model_path": model_dir, "flush_cache": False})
            assert status == 200 and reply["success"]
        finally:
            server.post("/continue_generation", {})
        assert future.result(60)[1]["meta_info"]["finish_reason"]["type"] == "length"
    print(json.dumps(server.get("/get_server_info")[1]["internal_states"]))

"""A small trainer for launcher tests: talks to every server, checks its rank environment.

Modes (env AREAL_TEST_TRAINER_MODE):
- ok (default): one /generate on every server, write <run_dir>/rank<R>.json, exit 0.
- fail: exit 3 after the same checks.
- wait: keep calling /generate (tolerating a server that is down) until <run_dir>/stop
  exists, then require every server to answer and exit 0; exit 4 if that fails.
- resync (one rank, one server): a real trainer (FSDPEngine + RemoteSGLangEngine) takes a
  large step and syncs it to the server by disk as version 1, writes <run_dir>/synced, and
  waits for the server to leave the rotation (the test kills it) and rejoin (the launcher
  restarts it on the initial weights); then writes <run_dir>/resync.json: the restarted
  server's logprobs and version, and the trainer's logprobs of the same tokens.
With distillation teachers (AREAL_TEACHER_SERVER_ADDRS), every mode but resync first has each
answer one /generate and writes <run_dir>/teachers<R>.json.
Writes its pid to <run_dir>/trainer-pids/<pid> so tests can check that nothing is left.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from arealite.config import GRPOConfig, load_config


def generate(addr: str, timeout: float = 60.0, prompt: list[int] | None = None, sampling: dict | None = None) -> dict:
    body = json.dumps(
        {
            "input_ids": prompt or [1, 2, 3],
            "sampling_params": sampling or {"max_new_tokens": 2, "temperature": 0.0},
            "return_logprob": True,
        }
    ).encode()
    req = urllib.request.Request(f"http://{addr}/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def main(argv: list[str]) -> int:
    config = load_config(argv, GRPOConfig)
    run_dir = config.run_dir
    os.makedirs(os.path.join(run_dir, "trainer-pids"), exist_ok=True)
    open(os.path.join(run_dir, "trainer-pids", str(os.getpid())), "w").close()
    addrs = os.environ["AREAL_LLM_SERVER_ADDRS"].split(",")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode = os.environ.get("AREAL_TEST_TRAINER_MODE", "ok")
    if mode == "resync":
        return resync(config, run_dir, addrs[0])
    teachers = [a for a in os.environ.get("AREAL_TEACHER_SERVER_ADDRS", "").split(",") if a]
    if teachers:  # the launcher started them before the ranks: each answers now
        record = {"addrs": teachers, "outputs": [generate(a)["output_ids"] for a in teachers]}
        path = os.path.join(run_dir, f"teachers{rank}.json")
        with open(path + ".tmp", "w") as f:  # the tests read it as soon as it exists: whole, or not there
            json.dump(record, f)
        os.replace(path + ".tmp", path)
    # In wait mode a test may kill a server as soon as the pid file exists, so no call here
    # may assume a server is up; the outputs recorded are those after the stop file.
    outputs = [] if mode == "wait" else [generate(a)["output_ids"] for a in addrs]
    if mode == "wait":
        stop = os.path.join(run_dir, "stop")
        while not os.path.exists(stop):
            for a in addrs:
                try:
                    generate(a, timeout=10.0)
                except OSError:
                    pass  # a killed server; the launcher restarts it (or stops the run)
            time.sleep(0.2)
        deadline = time.monotonic() + 120.0  # a restarted server may still be loading
        while True:
            try:
                outputs = [generate(a)["output_ids"] for a in addrs]
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    print(f"a server did not answer after the stop file: {e}", flush=True)
                    return 4
                time.sleep(0.5)
    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "master": f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        "addrs": addrs,
        "outputs": outputs,
    }
    with open(os.path.join(run_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    print(f"rank {rank}/{world} talked to {len(addrs)} server(s)", flush=True)
    return 3 if mode == "fail" else 0


def resync(config: GRPOConfig, run_dir: str, addr: str) -> int:
    from arealite.config import InferenceEngineConfig
    from arealite.rollout import RemoteSGLangEngine
    from arealite.weight_sync import WeightSync
    from tests.train.server_utils import batch_from_results, moved_trainer, trainer_logprobs

    trainer = moved_trainer(config.actor.path, os.path.join(run_dir, "moved"))
    rollout = RemoteSGLangEngine(
        InferenceEngineConfig(setup_timeout=120, request_timeout=60, health_check_interval=0.5), [addr]
    )
    rollout.initialize()
    try:
        WeightSync(trainer, rollout, "disk", run_dir).sync(1)
        open(os.path.join(run_dir, "synced"), "w").close()
        for what, done in (
            ("leave", lambda: addr in rollout.pool.down),
            ("rejoin", lambda: addr in rollout.pool.healthy),
        ):
            deadline = time.monotonic() + 120.0
            while not done():
                if time.monotonic() > deadline:
                    print(f"the server did not {what} the rotation", flush=True)
                    return 4
                time.sleep(0.1)
        prompt = [5, 17, 42, 99]
        reply = generate(addr, prompt=prompt, sampling={"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True})
        batch = batch_from_results([prompt], [reply])
        record = {
            "server_version": reply["meta_info"]["weight_version"],
            "server": batch["logprobs"][0].tolist(),
            "trainer": trainer_logprobs(trainer, batch)[0].tolist(),
            "loss_mask": batch["loss_mask"][0].tolist(),
        }
    finally:
        rollout.destroy()
        trainer.destroy()
    with open(os.path.join(run_dir, "resync.json"), "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

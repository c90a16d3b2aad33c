"""A small trainer for launcher tests: talks to every server, checks its rank environment.

Modes (env AREAL_TEST_TRAINER_MODE):
- ok (default): one /generate on every server, write <run_dir>/rank<R>.json, exit 0.
- fail: exit 3 after the same checks.
- wait: keep calling /generate (tolerating a server that is down) until <run_dir>/stop
  exists, then require every server to answer and exit 0; exit 4 if that fails.
Writes its pid to <run_dir>/trainer-pids/<pid> so tests can check that nothing is left.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from arealite.config import GRPOConfig, load_config


def generate(addr: str, timeout: float = 60.0) -> dict:
    body = json.dumps(
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0.0}, "return_logprob": True}
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The real model's rollout on vLLM and on the built-in server: raw requests vs arealite's client.

    PYTHONPATH=. python benchmarks/engines.py [MODEL_DIR] [--requests 64] [--max-new-tokens 128] \
        [--repeats 3] [--probe-tokens 32] [--vllm-candidates ...] [--builtin-threads 1 2] [--smoke]

MODEL_DIR: SmolLM2-135M-Instruct in fp32, default the folder configs/smollm2_cpu.yaml builds
(`runs/models/smollm2_135m_instruct`; `python -m arealite.tools.smollm2` builds it). The
workload is that job's: its chat-templated addition questions, `group_size` 8 samples each,
temperature 1, a seed per sample, `--requests` requests at once (64: 8 prompts), but
`--max-new-tokens` long with `min_new_tokens` equal to it, so every request of every arm
generates exactly that many tokens (EOS is not sampled before; the server does the same work
on every arm). Three arms, one run:

(a) raw: the strongest client a reviewer would name, plain aiohttp (the library the client
    uses) with one warm session on this thread's event loop, firing the same token-in
    requests (the exact bodies the client sends, seeds included) at vLLM's
    `/inference/v1/generate` at once and parsing every reply;
(b) client on vLLM: what a training script runs, `arealite.rollout_client(config)` (a
    `RemoteVLLMEngine`) and `rollout_batch` over the job's `RLVRWorkflow` (chat template,
    per-sample seeds, decoding and the job's reward in a `RewardPool`, trajectory tensors):
    everything the client does for a batch counts against it;
(c) the same client (`RemoteSGLangEngine`) on the built-in server.

Servers: each started with the project's own command (`server_cmd.server_command`, what the
launchers run; the vLLM one is `vllm_command`), on the same CPUs (all of this process's:
client and server share them, as on a one-machine job). Their knobs are searched first, each
candidate started alone and timed on `--probe-tokens` tokens through the client (after a
warm-up run): vLLM's thread layout (the launcher's `VLLM_CPU_OMP_THREADS_BIND=nobind` with 1
or 2 OpenMP threads, i.e. `launcher.cpus_per_server` 1 or 2; threads bound to every CPU; the
same with Intel OpenMP preloaded, vLLM's advice for CPUs), the built-in server's torch threads.
Both keep `max_num_seqs` / `max_running_requests` at the job's 64 (every request in one batch)
and vLLM its KV cache at `VLLM_CPU_KVCACHE_SPACE` 1 GiB: the preemptions it reports after the
run show whether that was short. The fastest candidate of each stays up; the other server idles
while one is timed (its CPU seconds during every run are printed, to show it is idle).

Repeats: `--repeats` rounds of (a), (b), (c), in alternating order. Figures (paired per round):
`builtin_vs_vllm` = tokens/s of (c) / (b) (informational: which engine a CPU user should pick),
then last `client_on_vllm_vs_raw` = tokens/s of (b) / (a) (goal >= 0.97).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

CONFIG = "configs/smollm2_cpu.yaml"
HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
# vLLM thread layouts: name -> environment; "{cpus}" is this process's CPUs, e.g. 0-1
VLLM_CANDIDATES = {
    "nobind-1": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
    "nobind-all": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "{n}"},
    "bind-all": {"VLLM_CPU_OMP_THREADS_BIND": "{cpus}", "OMP_NUM_THREADS": "{n}"},
    "bind-all-iomp": {"VLLM_CPU_OMP_THREADS_BIND": "{cpus}", "OMP_NUM_THREADS": "{n}", "LD_PRELOAD": "{iomp}"},
}


# ---- the job's config, workload and servers ---------------------------------------------------


def job_config(model: str, backend: str, max_new_tokens: int):
    """configs/smollm2_cpu.yaml on `model` with `backend`, every request exactly `max_new_tokens` long."""
    from arealite.config import GRPOConfig, load_config

    overrides = [f"actor.path={model}", f"server.backend={backend}", f"gconfig.max_new_tokens={max_new_tokens}"]
    overrides += [f"gconfig.min_new_tokens={max_new_tokens}", "weight_update=disk"]
    return load_config(["--config", os.path.join(harness.REPO, CONFIG), *overrides], GRPOConfig)


def job_records(config, n_prompts: int) -> list[dict]:
    from arealite.data.loader import load_records

    return load_records(config.train_dataset, split="train", seed=config.seed)[:n_prompts]


def raw_bodies(config, records: list[dict], tokenizer) -> list[dict]:
    """The exact `/inference/v1/generate` bodies `RLVRWorkflow` has the client send (version 0)."""
    from arealite.backends.vllm import VLLMProtocol
    from arealite.workflow.prompt import encode_prompt
    from arealite.workflow.seeding import seeded_gconfig

    g, protocol, bodies = config.gconfig, VLLMProtocol(), []
    for record in records:
        ids = encode_prompt(tokenizer, record)
        for i in range(g.group_size):
            bodies.append(protocol.generate_body(ids, seeded_gconfig(g, record, ids, i, 0), g.max_new_tokens))
    return bodies


def iomp_library() -> str:
    from arealite.backends.vllm_launch import vllm_python

    path = os.path.join(os.path.dirname(os.path.dirname(vllm_python())), "lib", "libiomp5.so")
    return path if os.path.isfile(path) else ""


class ServerDidNotStart(RuntimeError):
    pass


def start_server(name: str, config, backend: str, env_extra: dict[str, str], log_dir: str):
    """The launcher's server command for `backend` with `env_extra`; returns (process, address, argv)."""
    from arealite.launcher.process import ManagedProcess
    from arealite.launcher.server_cmd import server_command
    from arealite.utils.net import free_ports, wait_healthy

    port = free_ports(1, HOST)[0]
    cmd = server_command(config, HOST, port, backend)
    # vllm_command fixes the launcher's thread binding in its `env` prefix; a candidate replaces it there
    bind = env_extra.get("VLLM_CPU_OMP_THREADS_BIND")
    if bind is not None:
        cmd = [f"VLLM_CPU_OMP_THREADS_BIND={bind}" if a.startswith("VLLM_CPU_OMP_THREADS_BIND=") else a for a in cmd]
    env = {**os.environ, **harness.CPU_ONLY, **{k: v for k, v in env_extra.items() if v}}
    if backend == "vllm":
        env.pop("PYTHONPATH", None)  # vLLM's environment, not ours
    proc = ManagedProcess(name, cmd, os.path.join(log_dir, f"{name}.log"), env=env, cwd=log_dir)
    started = time.monotonic()
    proc.start()
    address = f"{HOST}:{port}"
    if not wait_healthy(address, START_TIMEOUT_S, alive=lambda: proc.poll() is None, interval=1.0):
        proc.stop(grace=10.0)
        with open(proc.log_path, errors="replace") as f:
            tail = f.read()[-3000:]
        raise ServerDidNotStart(f"server {name} did not come up; its log {proc.log_path} ends:\n{tail}")
    print(f"  {name}: up in {time.monotonic() - started:.0f} s at {address}", flush=True)
    return proc, address, cmd


def preemptions(address: str) -> str:
    """vLLM's preemption counter from /metrics (0: the KV cache held every request)."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as r:
            lines = r.read().decode().splitlines()
    except OSError as e:
        return f"unknown (/metrics: {e})"
    found = [line.split()[-1] for line in lines if line.startswith("vllm:num_preemptions_total")]
    return found[0] if found else "not reported"


# ---- the arms -----------------------------------------------------------------------------------


class Arms:
    """The timed runs: raw aiohttp on vLLM, and the job's client on either server."""

    def __init__(self, bodies: list[dict], records: list[dict], tokenizer, config) -> None:
        import aiohttp

        from arealite import RewardPool, RLVRWorkflow, reward_fn_for

        self.bodies, self.records, self.config = bodies, records, config
        self.loop = asyncio.new_event_loop()
        self.session = self.loop.run_until_complete(self._session(aiohttp))
        self.pool = RewardPool(max_workers=2)  # as examples/gsm8k_grpo.py
        self.workflow = RLVRWorkflow(reward_fn_for(config), config.gconfig, tokenizer, self.pool)
        self.clients: dict[str, object] = {}

    @staticmethod
    async def _session(aiohttp):
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    def client(self, name: str, config, address: str):
        from arealite import rollout_client

        engine = rollout_client(config, [address])
        engine.initialize()
        self.clients[name] = engine
        return engine

    def raw(self, address: str, bodies: list[dict]) -> int:
        """Every body at once; the output tokens of the replies."""
        url = f"http://{address}/inference/v1/generate"

        async def one(body: dict) -> int:
            async with self.session.post(url, json=body) as resp:
                reply = json.loads(await resp.read())
            if resp.status != 200:
                raise RuntimeError(f"raw request failed: {resp.status} {reply}")
            return len(reply["choices"][0]["token_ids"])

        async def all_of() -> list[int]:
            return await asyncio.gather(*(one(b) for b in bodies))

        return sum(self.loop.run_until_complete(all_of()))

    def orchestrated(self, name: str, records: list[dict]) -> int:
        batch = self.clients[name].rollout_batch(records, self.workflow)
        return int(batch["loss_mask"].sum())

    def close(self) -> None:
        for engine in self.clients.values():
            engine.destroy()
        self.loop.run_until_complete(self.session.close())
        self.loop.close()
        self.pool.close()


def timed(fn, idle_pids: list[int]) -> dict:
    """Wall seconds, output tokens and the idle servers' CPU seconds over one run of `fn`."""
    harness.settle()
    idle = [harness.tree_cpu_seconds(p) for p in idle_pids]
    start = time.perf_counter()
    tokens = fn()
    wall = time.perf_counter() - start
    idle_cpu = sum(harness.tree_cpu_seconds(p) - c for p, c in zip(idle_pids, idle))
    return {"wall": wall, "tokens": tokens, "tok_s": tokens / wall, "idle_cpu": idle_cpu}


# ---- the knob search --------------------------------------------------------------------------


def search(
    label: str, candidates: dict[str, dict[str, str]], config, backend: str, arms: Arms, probe: list[dict], log_dir: str
):
    """Start each candidate alone, warm it and time one probe through the client; keep the fastest
    running. Returns (name, process, address, argv, env)."""
    best = None
    for name, env in candidates.items():
        try:
            proc, address, cmd = start_server(f"{label}-{name}", config, backend, env, log_dir)
        except ServerDidNotStart as e:  # a layout this machine cannot run is reported, not fatal
            print(f"  {label} {name}: left out: {e}", flush=True)
            continue
        try:
            key = f"{label}-{name}"
            arms.client(key, config, address)
            arms.orchestrated(key, probe)  # warm-up: connections, allocators, first batches
            run = timed(lambda key=key: arms.orchestrated(key, probe), [])
        except BaseException:
            proc.stop(grace=10.0)
            raise
        print(f"  {label} {name}: {run['tok_s']:.0f} tok/s on the probe  ({harness.load_line()})", flush=True)
        arms.clients.pop(key).destroy()
        if best is None or run["tok_s"] > best[0]:
            if best is not None:
                best[2].stop(grace=10.0)
            best = (run["tok_s"], name, proc, address, cmd, env)
        else:
            proc.stop(grace=10.0)
    if best is None:
        raise SystemExit(f"no {label} candidate started: see the logs above")
    _, name, proc, address, cmd, env = best
    print(f"  {label}: keeping {name}", flush=True)
    return name, proc, address, cmd, env


def resolved(candidates: list[str], cpus: list[int]) -> dict[str, dict[str, str]]:
    fill = {"cpus": f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else ",".join(map(str, cpus)),
            "n": str(len(cpus)), "iomp": iomp_library()}  # fmt: skip
    out = {}
    for name in candidates:
        if name not in VLLM_CANDIDATES:
            raise SystemExit(f"--vllm-candidates: unknown {name!r}; choose from {sorted(VLLM_CANDIDATES)}")
        env = {k: v.format(**fill) for k, v in VLLM_CANDIDATES[name].items()}
        if "LD_PRELOAD" in env and not env["LD_PRELOAD"]:
            print(f"  skipping vLLM candidate {name}: no libiomp5.so in vLLM's environment")
            continue
        out[name] = env
    return out


# ---- main ---------------------------------------------------------------------------------------


def check_inputs(model: str) -> None:
    from arealite.backends.vllm_launch import vllm_python

    if not os.path.isfile(os.path.join(model, "config.json")):
        raise SystemExit(
            f"model folder {model} has no config.json: build SmolLM2-135M-Instruct there with "
            f"`python -m arealite.tools.smollm2 {model}` (configs/smollm2_cpu.yaml's setup_commands show how), "
            "or pass its folder as the first argument"
        )
    python = vllm_python()
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if not os.path.exists(python) or os.spawnv(os.P_WAIT, python, [python, "-c", probe]) != 0:
        raise SystemExit(f"vLLM is not installed for {python}: install it as the README says (section vLLM)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=os.path.join(harness.REPO, "runs/models/smollm2_135m_instruct"))
    parser.add_argument("--requests", type=int, default=64, help="requests per run (a multiple of group_size 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens every request generates")
    parser.add_argument("--probe-tokens", type=int, default=32, help="tokens per request in the knob search")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three arms, alternating order")
    parser.add_argument("--vllm-candidates", nargs="+", default=list(VLLM_CANDIDATES), help="vLLM layouts searched")
    parser.add_argument("--builtin-threads", nargs="+", type=int, default=None, help="default: 1 and all CPUs")
    parser.add_argument("--smoke", action="store_true", help="one candidate each, 8 requests of 8 tokens, 1 round")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if args.smoke:
        args.requests, args.max_new_tokens, args.probe_tokens, args.repeats = 8, 8, 4, 1
        args.vllm_candidates, args.builtin_threads = ["bind-all"], [len(cpus)]
    threads = args.builtin_threads or sorted({1, len(cpus)})
    model = os.path.abspath(args.model)
    check_inputs(model)
    print(harness.machine_line())
    print(harness.commit_line())
    print(f"resources: every server and this client (the driver: raw aiohttp and arealite's client) on CPUs {cpus}")
    with tempfile.TemporaryDirectory() as log_dir:
        runs, info = measure(args, model, cpus, threads, log_dir)
    report(args, runs, info)


def measure(args, model: str, cpus: list[int], threads: list[int], log_dir: str):
    from transformers import AutoTokenizer

    vllm_cfg = job_config(model, "vllm", args.max_new_tokens)
    builtin_cfg = job_config(model, "builtin", args.max_new_tokens)
    group = vllm_cfg.gconfig.group_size
    if args.requests % group:
        raise SystemExit(f"--requests {args.requests} is not a multiple of the job's group_size {group}")
    tokenizer = AutoTokenizer.from_pretrained(model)
    records = job_records(vllm_cfg, args.requests // group)
    probe_cfg = job_config(model, "vllm", args.probe_tokens)
    bodies = raw_bodies(vllm_cfg, records, tokenizer)
    arms = Arms(bodies, records, tokenizer, vllm_cfg)
    servers = []
    try:
        print(f"vLLM knob search ({args.probe_tokens} tokens x {args.requests} requests):", flush=True)
        arms.workflow.gconfig = probe_cfg.gconfig
        v_name, v_proc, v_addr, v_cmd, v_env = search(
            "vllm", resolved(args.vllm_candidates, cpus), vllm_cfg, "vllm", arms, records, log_dir
        )
        servers.append(v_proc)
        print("built-in server knob search:", flush=True)
        b_cands = {f"threads-{t}": {"OMP_NUM_THREADS": str(t)} for t in threads}
        b_name, b_proc, b_addr, b_cmd, b_env = search(
            "builtin", b_cands, builtin_cfg, "builtin", arms, records, log_dir
        )
        servers.append(b_proc)
        arms.workflow.gconfig = vllm_cfg.gconfig
        arms.client("vllm", vllm_cfg, v_addr)
        arms.client("builtin", builtin_cfg, b_addr)
        arms.raw(v_addr, raw_bodies(probe_cfg, records, tokenizer))  # the raw session's connections open
        plan = {
            "raw_vllm": (lambda: arms.raw(v_addr, bodies), [b_proc.pid]),
            "client_vllm": (lambda: arms.orchestrated("vllm", records), [b_proc.pid]),
            "client_builtin": (lambda: arms.orchestrated("builtin", records), [v_proc.pid]),
        }
        runs: dict[str, list[dict]] = {name: [] for name in plan}
        print(f"timed rounds ({args.max_new_tokens} tokens x {args.requests} requests):", flush=True)
        for i in range(args.repeats):
            for name in harness.order(i, list(plan)):
                fn, idle = plan[name]
                r = timed(fn, idle)
                runs[name].append(r)
                print(f"  round {i}: {name:<15} {r['wall']:7.2f} s  {r['tok_s']:6.1f} tok/s  idle server CPU "
                      f"{r['idle_cpu']:.2f} s  ({harness.load_line()})", flush=True)  # fmt: skip
        info = {
            "vllm": (v_name, v_cmd, v_env, harness.process_tree(v_proc.pid), preemptions(v_addr)),
            "builtin": (b_name, b_cmd, b_env, harness.process_tree(b_proc.pid), None),
        }
        return runs, info
    finally:
        arms.close()
        for proc in servers:
            proc.stop(grace=10.0)


def report(args, runs: dict[str, list[dict]], info: dict) -> None:
    for engine, (name, cmd, env, tree, preempted) in info.items():
        print(f"{engine} ran as {name}: env {' '.join(f'{k}={v}' for k, v in env.items())}")
        print(f"  argv: {' '.join(cmd)}")
        for line in tree:
            print(f"  {line}")
        if preempted is not None:
            print(f"  preemptions over the whole run (0: the KV cache held every request): {preempted}")
    for name, rs in runs.items():
        print(f"{name:<15} tok/s: {harness.spread([r['tok_s'] for r in rs], '.1f')}")
        print(f"{name:<15} tokens per run: {sorted({r['tokens'] for r in rs})}")
    client_vs_raw = [b["tok_s"] / a["tok_s"] for a, b in zip(runs["raw_vllm"], runs["client_vllm"])]
    builtin_vs_vllm = [c["tok_s"] / b["tok_s"] for b, c in zip(runs["client_vllm"], runs["client_builtin"])]
    print(f"client on vLLM / raw on vLLM, tok/s (paired): {harness.spread(client_vs_raw, '.3f')}")
    print(f"built-in / vLLM, both through the client, tok/s (paired): {harness.spread(builtin_vs_vllm, '.3f')}")
    print(harness.load_line())
    print(f"builtin_vs_vllm={harness.quartiles(builtin_vs_vllm)[2]:.3f}")
    print(f"client_on_vllm_vs_raw={harness.quartiles(client_vs_raw)[2]:.3f}")


if __name__ == "__main__":
    main()

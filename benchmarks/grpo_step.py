"""The arealite side of vs_trl.py and async_speedup.py: one built-in server plus the training
loop of examples/gsm8k_grpo.py, in a worker process (`harness.SideProcess`) that runs timed
GRPO runs on request.

Set up once per worker (before any clock): the server process (a child, so it inherits the
worker's CPU affinity; optionally moved to its own CPUs), the tokenizer, the workflow and
its reward worker processes (started and warmed up). Each run names its own staleness
bound k and batch size, so one worker serves every configuration of a benchmark on the
very same processes. Each run starts from the same state: the server is reset to the
initial weights (version 0), a fresh trainer loads the initial weights, a fresh rollout
client starts with an empty pipeline, and the dataloader starts at the same first prompt.
The clock covers every step, the first included (an asynchronous run pays for filling its
pipeline). After a run, anything still generating
(prefetched batches of an asynchronous run) is aborted and the server is idle before the
worker answers, so no work spills into another side's run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import harness

from arealite.weight_sync import WeightSync


def timed_grpo_step(
    step: int,
    rollout: Any,
    actor: Any,
    workflow: Any,
    loader: Any,
    data_iter: Iterator,
    weight_sync: WeightSync,
    lockstep: Any = None,
) -> tuple[dict, list[float]]:
    """rollout -> advantages -> PPO update -> disk weight sync to version step + 1.

    With a `lockstep` schedule (arealite.rollout.lockstep) its next batch, drained before the
    sync (the drain counts as sync time); else asynchronous (`prepare_batch`) when the
    engine's max_head_offpolicyness > 0, else the next item of `data_iter` through
    `rollout_batch`. Returns the batch and the seconds of [rollout, train, weight sync].
    """
    start = time.perf_counter()
    if lockstep is not None:
        batch = lockstep.next_batch()
    elif rollout.config.max_head_offpolicyness > 0:
        batch = rollout.prepare_batch(loader, workflow)
    else:
        batch = rollout.rollout_batch(next(data_iter), workflow)
    t_rollout = time.perf_counter()
    actor.compute_advantages(batch)  # prox_logp comes from the update's own forward (one minibatch)
    actor.ppo_update(batch)
    t_train = time.perf_counter()
    if lockstep is not None:
        lockstep.drain()
    weight_sync.sync(step + 1)
    return batch, [t_rollout - start, t_train - t_rollout, time.perf_counter() - t_train]


def staleness_histogram(batch: dict, step: int) -> Counter:
    """Trained tokens by staleness: trainer version `step` minus the version that sampled each token."""
    trained = batch["loss_mask"].bool() & (batch["versions"] >= 0)
    return Counter((step - batch["versions"][trained]).tolist())


def setup(s: dict) -> dict:
    """Start the server, tokenizer, workflow and warm reward workers.

    `s`: model, workdir, group_size, max_new_tokens, seed, lr, server_threads,
    trainer_threads, max_in_flight (prompts any run may have in flight), and optionally
    server_cpus / trainer_cpus, max_tokens_per_mb, actor (extra PPOActorConfig fields),
    records_fn / reward_fn ("module:function"; default the arithmetic task: records_fn(n, seed)
    returns n chat records, reward_fn is a reward function of the workflow's signature).
    """
    from concurrent.futures import ThreadPoolExecutor

    from arealite.server.process import ServerStartError, launch_server_process

    requests = s["max_in_flight"] * s["group_size"]
    extra = [
        "--torch-threads",
        str(s["server_threads"]),
        "--random-seed",
        str(s["seed"]),
        "--max-running-requests",
        str(requests),
    ]
    env = {"OMP_NUM_THREADS": str(s["server_threads"])}
    log = os.path.join(s["workdir"], "server.log")

    def start_server():
        if s.get("server_cpus"):
            os.sched_setaffinity(0, set(s["server_cpus"]))  # this thread only; the server process inherits it
        # a generous start-up bound: on a loaded machine the server can take minutes to come up
        for attempt in range(3):
            try:
                return launch_server_process(s["model"], extra_args=extra, env=env, log_path=log, timeout=600)
            except ServerStartError as e:
                # its free port can be taken between the pick and the bind (here: by the trainer's
                # process group, which picks its own port at the same time); pick again
                if "address already in use" not in str(e) or attempt == 2:
                    raise

    with ThreadPoolExecutor(1) as starter:
        server = starter.submit(start_server)  # the server starts while this process imports torch
        if s.get("trainer_cpus"):
            os.sched_setaffinity(0, set(s["trainer_cpus"]))  # the main thread; threads it starts inherit it
        import torch
        from transformers import AutoTokenizer

        from arealite.config import GenerationHyperparameters
        from arealite.reward.pool import RewardPool
        from arealite.workflow import RLVRWorkflow
        from arealite.world import init_distributed

        torch.set_num_threads(s["trainer_threads"])
        init_distributed()
        pool = RewardPool(max_workers=2)
        reward_fn = workload_reward(s)
        pool.score(reward_fn, "", "0", answer="0")  # start the reward workers before any clock
        gconfig = GenerationHyperparameters(
            group_size=s["group_size"], max_new_tokens=s["max_new_tokens"], temperature=1.0
        )
        workflow = RLVRWorkflow(reward_fn, gconfig, AutoTokenizer.from_pretrained(s["model"]), reward_pool=pool)
        server = server.result()
    return {"s": s, "server": server, "pool": pool, "workflow": workflow}


def workload_reward(s: dict):
    """The reward function of the workload (`s["reward_fn"]`, default the arithmetic task's)."""
    from arealite.utils.imports import import_object

    return import_object(s.get("reward_fn") or "arealite.data.arithmetic:arithmetic_reward_fn")


def workload_records(s: dict, n: int) -> list[dict]:
    """`n` training records of the workload (`s["records_fn"](n, seed)`, default the arithmetic task's)."""
    from arealite.utils.imports import import_object

    make = import_object(s.get("records_fn") or "arealite.data.arithmetic:make_arithmetic_dataset")
    return make(n, seed=s["seed"])


def _server_info(server: Any) -> dict:
    status, info = server.get("/get_server_info", timeout=10)
    if status != 200:
        raise RuntimeError(f"/get_server_info answered {status}: {info}")
    return info["internal_states"][0]


def server_work(server: Any) -> tuple[float, int]:
    """(CPU seconds of the server process, decode steps it has run): read before and after
    a run, outside its clock, they say how busy the server was and at what occupancy."""
    return harness.tree_cpu_seconds(server.proc.pid), int(_server_info(server)["decode_steps"])


def _server_idle(server: Any, timeout: float = 60.0) -> None:
    """Abort whatever the server still runs and wait until it has nothing queued or running."""
    server.post("/abort_request", {"abort_all": True})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = _server_info(server)
        if st["num_running"] == 0 and st["num_waiting"] == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"server still busy {timeout}s after abort_all")


def run(state: dict, req: dict) -> dict:
    """`req["steps"]` timed GRPO steps of `req["batch_size"]` prompts at staleness bound
    `req["k"]`, from the initial weights; returns per-step figures."""
    from arealite.config import InferenceEngineConfig, MicroBatchSpec, OptimizerConfig, PPOActorConfig
    from arealite.data.loader import create_dataloader
    from arealite.rollout import RemoteSGLangEngine
    from arealite.rollout.lockstep import LockstepRollout
    from arealite.train import PPOActor
    from arealite.types import WeightUpdateMeta

    s, server, workflow = state["s"], state["server"], state["workflow"]
    steps, k, batch_size = req["steps"], req["k"], req["batch_size"]
    if (k + 1) * batch_size > s["max_in_flight"]:
        raise ValueError(f"k={k} x batch {batch_size} exceeds the server's max_in_flight={s['max_in_flight']} prompts")
    records = workload_records(s, batch_size * (steps + k + 2))
    loader = create_dataloader(records, batch_size, shuffle=False, seed=s["seed"])
    config = InferenceEngineConfig(
        max_head_offpolicyness=k, max_concurrent_rollouts=(k + 1) * batch_size, pause_mode=s["pause_mode"]
    )
    rollout = RemoteSGLangEngine(config, [server.address])
    rollout.initialize()
    rollout.update_weights(WeightUpdateMeta(type="disk", path=s["model"], version=0)).result()  # the initial weights
    actor = PPOActor(
        PPOActorConfig(
            path=s["model"], optimizer=OptimizerConfig(lr=s["lr"], gradient_clipping=1.0),
            mb_spec=MicroBatchSpec(max_tokens_per_mb=s.get("max_tokens_per_mb")),
            use_decoupled_loss=k > 0,  # stale samples: the decoupled loss, as configs/gsm8k_grpo.yaml
            **s.get("actor", {}),
        ),
        workflow.gconfig,  # the group size, budget and temperature the workflow samples with
    ).initialize()  # fmt: skip
    workdir = tempfile.mkdtemp(dir=s["workdir"])
    weight_sync = WeightSync(actor, rollout, "disk", workdir)
    times, phases, rewards, lengths, stale, tokens = [], [], [], [], Counter(), 0
    data_iter = iter(loader)
    lockstep = LockstepRollout(rollout, data_iter, workflow, k) if req.get("schedule") == "lockstep" else None
    server0 = server_work(server)
    cpu0, start = harness.tree_cpu_seconds(), time.perf_counter()
    for step in range(steps):
        batch, phase = timed_grpo_step(step, rollout, actor, workflow, loader, data_iter, weight_sync, lockstep)
        times.append(sum(phase))
        phases.append(phase)
        rewards.append(batch["rewards"].float().mean().item())
        per_row = batch["loss_mask"].sum(1)  # completion tokens of each trained sample
        lengths.append(per_row.float().mean().item())
        tokens += int(per_row.sum().item())
        stale += staleness_histogram(batch, step)
    wall, cpu = time.perf_counter() - start, harness.tree_cpu_seconds() - cpu0
    server_cpu, decode_steps = (b - a for a, b in zip(server0, server_work(server)))
    resources = harness.process_tree(os.getpid())  # reward workers and server included
    counters = rollout.export_stats()
    rollout.destroy()
    actor.destroy()
    _server_idle(server)
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        "wall": wall, "cpu": cpu, "times": times, "phases": phases, "rewards": rewards, "lengths": lengths,
        "staleness": {str(k): v for k, v in sorted(stale.items())}, "counters": counters, "resources": resources,
        "trained_tokens": tokens, "server_cpu": server_cpu, "decode_steps": decode_steps,
    }  # fmt: skip


def teardown(state: dict) -> None:
    state["pool"].close()
    state["server"].stop()

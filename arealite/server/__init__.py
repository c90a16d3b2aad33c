"""The built-in inference server: SGLang's native HTTP protocol on a transformers model.

    python -m arealite.server --model-path DIR [--host 127.0.0.1] [--port 30000] [--random-seed S]
    arealite.server.process.launch_server_process(DIR) -> ServerProcess  (tests, notebooks)

It mimics SGLang **0.5.23** (docs/protocol.md; where versions differ, 0.5.23 wins):
* `/generate` single and batch, `text` or `input_ids`, `n > 1` (fresh rids, grouped by
  prompt), `stream` (cumulative chunks as 0.5.6+, `index` on batch chunks, `data: [DONE]`),
  logprob triples `[logprob, id, text|null]`, `top_logprobs_num`, `logprob_start_len`.
  Strict JSON contract (0.5.22+): an unknown `sampling_params` key or a wrong JSON type is
  400 `{"error": "<string>"}`; `null` sampling values mean the default (0.5.16+); other bad
  values and context overflows are 400 `{"error": {"message": ...}}` (in-band for streams).
* `meta_info`: `id`, `finish_reason`, `prompt_tokens`, `completion_tokens`, `cached_tokens`,
  `weight_version` (always), `weight_versions` spans and `e2e_latency` when finished,
  `num_retractions` (0.5.16+ name).
* `/pause_generation` REQUIRES a JSON body as 0.5.6+ does (`{}` is fine; an empty body is a
  400), so clients that pass here also pass on real servers. Mode `abort` returns only after
  every in-flight request has been answered (0.5.6+); `in_place` keeps the KV cache;
  `retract` drops it and recomputes on `/continue_generation`. Requests sent while paused
  wait. A weight update while paused skips the update lock (0.5.6+); otherwise it waits for
  in-flight requests, and new requests queue behind it.
* Updates from disk and over torch.distributed (gloo on CPU, nccl on CUDA); an update with
  `flush_cache` while paused requests exist loads the weights and answers 400 (0.5.22+).
* `/health`, `/health_generate`, `/ready`, `/get_model_info`, `/model_info`,
  `/get_server_info`, `/server_info`, `/v1/models`, `/flush_cache`, `/abort_request`,
  `/update_weight_version`; `--api-key` (Bearer; `/health*` open; 401 `{"error":"Unauthorized"}`).

Deliberate differences from SGLang:
* `/health` does not run a generation (as SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false), so
  a long pause never looks like a dead server; `/health_generate` does generate.
* An aborted running request answers at once (SGLang runs one more forward step first).
* No prefix cache: `cached_tokens` is 0 and `/flush_cache` only applies SGLang's refusal rule.
* Logprobs are log_softmax(logits / T) after penalties, before top-k/top-p/min-p truncation
  (docs/architecture.md §3.1); greedy reports temperature-1 logprobs, as SGLang's greedy rewrite does.
  The top-level `processed_logprobs: true` (arealite's extension) asks for the truncated,
  renormalised distribution's logprobs instead (docs/protocol.md §1.6.1).
* `--enable-deterministic-inference` runs each sequence through the model alone (deterministic.py).
* `ignore_eos` drops only the model's EOS ids; `stop_token_ids` always apply.
* With `n > 1` and a `sampling_seed`, copy i uses seed + i (otherwise the copies would be equal).
* A missing weight-update group is a clean 400 (SGLang asserts in its scheduler).
* Per-request caps (limits.py: body bytes, JSON depth, `n`, tokens per request,
  `top_logprobs_num`) answer 413/400; SGLang has none. `/init_weights_update_group` takes an
  optional `timeout` (default `--dist-timeout`) bounding the rendezvous and every receive;
  a group whose receive failed is dropped. A disk update needs a local directory.
* `--dtype auto` runs fp32 on CPU (bf16 matmuls there are slow and imprecise).
* Not supported (400 naming the field): `input_embeds`, grammars (`json_schema`, `regex`,
  `ebnf`, `structural_tag`, `stop_regex`), `load_format` on distributed updates. Ignored:
  LoRA, multimodal inputs; OpenAI routes are absent.

Modules: cli (flags), app (routes, health/info, warmup), generate (/generate), control
(pause, abort, flush), weights (updates), protocol (body parsing), limits (request caps),
sampling (params and sampler), scheduler (continuous batching), model_runner (forward + KV
batch), request, output (result objects), errors (SGLang's error shapes), state (shared
state and the pause/update gate), process (subprocess helper).
"""

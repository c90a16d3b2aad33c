"""Turning a request's state into SGLang's result object (docs/protocol.md §1.6).

`output_ids` keep the EOS / stop token and any stop-string tokens; `text` drops a matched
stop token id and cuts at a matched stop string unless `no_stop_trim`. Logprob triples are
`[logprob, token_id, text|null]` aligned with `output_ids`. A request aborted while still
queued gets SGLang's reduced meta_info (no `prompt_tokens`).
"""

from __future__ import annotations

import time

from arealite.server.request import Req


def output_text(req: Req, n: int, tokenizer) -> str:
    ids = req.output_ids[:n]
    reason = req.finish_reason if n == len(req.output_ids) else None
    matched = reason.get("matched") if reason and reason.get("type") == "stop" else None
    no_trim = req.params.no_stop_trim
    if isinstance(matched, int) and not no_trim and ids:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=req.params.skip_special_tokens)
    if isinstance(matched, str) and not no_trim:
        cut = text.find(matched)
        if cut >= 0:
            text = text[:cut]
    return text


def _triples(values, ids, tokenizer, with_text: bool) -> list:
    return [
        [lp, tid, tokenizer.decode([tid]) if with_text and tid is not None else None] for lp, tid in zip(values, ids)
    ]


def build_result(req: Req, n: int, tokenizer, weight_version: str, with_text: bool, finished: bool) -> dict:
    """The result object for `req` after its first `n` output tokens (a stream chunk or final)."""
    ids = req.output_ids[:n]
    reason = req.finish_reason if finished else None
    queued_abort = finished and not req.started
    meta: dict = {"id": req.rid, "finish_reason": reason}
    if not queued_abort:
        meta["prompt_tokens"] = len(req.prompt)
    meta["completion_tokens"] = n
    if not queued_abort:
        meta["cached_tokens"] = 0
    versions = req.weight_version_spans(n)
    meta["weight_version"] = versions[-1]["version"] if (finished and versions) else weight_version
    if finished:
        meta["weight_versions"] = versions
        meta["e2e_latency"] = time.perf_counter() - req.created
    meta["num_retractions"] = req.num_retractions
    if req.return_logprob:
        if req.processed_logprobs:
            meta["processed_logprobs"] = True  # the client checks the server honoured the request
        meta["output_token_logprobs"] = _triples(req.output_logprobs[:n], ids, tokenizer, with_text)
        start = req.logprob_start_len
        input_ids = req.prompt[start:] if start >= 0 else []
        meta["input_token_logprobs"] = _triples(req.input_logprobs, input_ids, tokenizer, with_text)
        if req.top_logprobs_num > 0:
            meta["output_top_logprobs"] = [
                [[lp, tid, tokenizer.decode([tid]) if with_text else None] for lp, tid in pos]
                for pos in req.output_top[:n]
            ]
            meta["input_top_logprobs"] = []
    return {"text": output_text(req, n, tokenizer), "output_ids": list(ids), "meta_info": meta}

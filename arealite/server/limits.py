"""What one request may ask of the server: body size, JSON nesting, samples, tokens, top logprobs.

Each cap is a server flag (cli.py) and each refusal is a 4xx that names the field, the
allowed range and the flag to raise, so a hostile or mistaken client costs the server
nothing beyond reading the body:

* `--max-request-bytes`: a larger body is 413 (aiohttp stops reading at the cap);
* `--max-json-depth`: deeper nesting is 400 (Python's parser would otherwise recurse until
  RecursionError, a 500);
* `--max-parallel-samples`: `n` above it is 400, checked before the request is expanded;
* `--max-request-tokens`: prompt + max_new_tokens summed over every sequence of one request
  (batch items times `n`); above it is 400. Defaults to `--max-total-tokens`, the budget of
  all running requests together, so one request can never need more than the whole server;
* `--max-top-logprobs-num`: `top_logprobs_num` above it is 400 (each output token would
  carry that many triples).

SGLang has none of these flags; they are named in its style. SGLang's own cap on the stop
list (32 strings) is enforced in sampling.py.
"""

from __future__ import annotations

from dataclasses import dataclass

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class RequestLimits:
    max_request_bytes: int = 64 << 20
    max_json_depth: int = 32
    max_parallel_samples: int = 256
    max_request_tokens: int = 1 << 20
    max_top_logprobs_num: int = 256


def json_depth_exceeds(value, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests deeper than `limit` containers. Iterative, so a
    deep value cannot exhaust the stack; stops at the first path that crosses the limit."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False

"""`JudgeReward`: an LLM judge, served by an SGLang-protocol server, as a reward function.

Each (prompt, completion) is rendered into `judge.rubric` (fields `{question}` — the last
user message, else the prompt —, `{completion}`, `{prompt}` and any record field such as
`{answer}`), wrapped as a user turn by the judge tokenizer's chat template when
`judge.chat_template` is set, and sent greedily to `/generate` in batches
(`arealite.reward.batching`): concurrent samples share one request, a request that overruns
`judge.timeout` fails each of its samples with RewardTimeout, and an unreadable verdict fails
its sample with VerdictError (`arealite.reward.verdict`). The caller counts both
(`arealite.workflow.scoring`); neither becomes a 0.

The judge is never trained and never weight-synced: its server is not among the policy's
(`AREAL_LLM_SERVER_ADDRS`); the local launcher starts it from `judge.path` and exports
`AREAL_JUDGE_SERVER_ADDRS`, or `judge.address` names a server that already runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import weakref
from typing import Any

from arealite.config import GenerationHyperparameters, JudgeConfig
from arealite.reward.batching import MicroBatcher, per_loop
from arealite.reward.pool import RewardError
from arealite.reward.verdict import VerdictError, logprob_verdict, text_verdict
from arealite.utils.net import JUDGE_ADDRS_ENV

log = logging.getLogger(__name__)


def judge_addresses(config: JudgeConfig) -> list[str]:
    """`judge.address`, else the launcher's `AREAL_JUDGE_SERVER_ADDRS`; ValueError naming the fix if neither."""
    raw = config.address or os.environ.get(JUDGE_ADDRS_ENV, "")
    addrs = [a.strip().removeprefix("http://") for a in raw.split(",") if a.strip()]
    if not addrs:
        raise ValueError(
            f"no judge server: set judge.address=host:port, or launch with `python -m arealite.launcher.local`, "
            f"which serves judge.path={config.path!r} and exports {JUDGE_ADDRS_ENV}"
        )
    return addrs


def question_of(prompt: str, data: dict[str, Any]) -> str:
    """The last user message of a chat record, else the prompt text."""
    users = [m.get("content", "") for m in data.get("messages") or () if m.get("role") == "user"]
    return str(users[-1]) if users else prompt


def render_rubric(rubric: str, prompt: str, completion: str, data: dict[str, Any]) -> str:
    """`rubric` with `{question}`, `{completion}`, `{prompt}` and the record's fields filled in."""
    values = {**data, "prompt": prompt, "completion": completion, "question": question_of(prompt, data)}
    try:
        return rubric.format_map(values)
    except (KeyError, IndexError) as e:
        raise RewardError(
            f"judge.rubric names {e}, which this record lacks (it has {sorted(values)}); fix the rubric or the records"
        ) from None


class JudgeReward:
    """Scores completions with an LLM judge (module docstring). Picklable; usable as `reward_fn`."""

    def __init__(self, config: JudgeConfig, addresses: list[str] | None = None) -> None:
        self.config = config
        self.addresses = addresses or judge_addresses(config)
        self._tokenizer: Any = None
        self._batchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._turn = itertools.count()
        self.stats = {"judge_batches": 0, "judge_unparseable": 0, "judge_failed_batches": 0}

    def __getstate__(self) -> dict[str, Any]:  # a worker process builds its own tokenizer and batchers
        return {"config": self.config, "addresses": self.addresses}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state["addresses"])

    def render(self, prompt: str, completion: str, data: dict[str, Any]) -> str:
        """The judge's prompt text for one sample (chat markup included when configured)."""
        text = render_rubric(self.config.rubric, prompt, completion, data)
        if not self.config.chat_template:
            return text
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.path)
        return self._tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )

    async def ascore(
        self, prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, **data: Any
    ) -> float:
        """The judge's score of one completion in [0, 1]; RewardError / RewardTimeout when it has none."""
        text = self.render(prompt, completion, data)
        c = self.config
        batcher = per_loop(
            self._batchers,
            lambda: MicroBatcher(self._judge, c.max_batch_size, c.max_wait, c.max_concurrency, c.timeout, "judge"),
        )
        return await batcher.submit(text)

    def __call__(self, prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, **data: Any):
        """Blocking `ascore`: the plain reward-function signature (e.g. inside a RewardPool worker)."""
        return asyncio.run(self.ascore(prompt, completion, prompt_ids, completion_ids, **data))

    def _body(self, texts: list[str]) -> dict[str, Any]:
        """The rollout client's /generate body, greedy; with the logprob verdict one token, whose
        top logprobs carry the verdict."""
        from arealite.backends.sglang import generate_body

        c = self.config
        logprob = c.verdict == "logprob"
        budget = 1 if logprob else c.max_new_tokens
        greedy = GenerationHyperparameters(max_new_tokens=budget, temperature=0.0)
        return generate_body(texts, greedy, budget, top_logprobs=c.top_logprobs if logprob else 0)

    async def _judge(self, texts: list[str]) -> list[float | Exception]:
        """One batched `/generate` call through the rollout client's transport; one score or
        VerdictError per text."""
        from arealite.backends.contract import error_message
        from arealite.rollout.errors import TransientServerError
        from arealite.rollout.transport import Transport

        address = self.addresses[next(self._turn) % len(self.addresses)]
        self.stats["judge_batches"] += 1
        try:
            async with Transport() as transport:  # one per batch: none outlives its event loop
                status, results = await transport.request("POST", address, "/generate", self._body(texts))
        except asyncio.CancelledError:
            self.stats["judge_failed_batches"] += 1  # the batch's deadline passed
            raise
        except TransientServerError as e:
            self.stats["judge_failed_batches"] += 1
            raise RewardError(f"judge server {address} unreachable or failing: {e}") from e
        if status != 200:
            self.stats["judge_failed_batches"] += 1
            raise RewardError(f"judge server {address} answered {status}: {error_message(results)[:300]}")
        return [self._verdict(r) for r in results]

    def _verdict(self, result: dict[str, Any]) -> float | Exception:
        c = self.config
        try:
            if c.verdict == "logprob":
                top = result["meta_info"].get("output_top_logprobs") or [[]]
                return logprob_verdict(top[0], c.yes, c.no)
            return text_verdict(result["text"], c.yes, c.no, c.max_score)
        except VerdictError as e:
            self.stats["judge_unparseable"] += 1
            if self.stats["judge_unparseable"] <= 3:  # the first few, to show what the judge says
                log.warning("unparseable judge verdict (a failed reward): %s", e)
            return e

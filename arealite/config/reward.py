"""Model-based rewards: an LLM judge (`JudgeConfig`) or a scalar reward model
(`RewardModelConfig`), each used instead of a verifiable reward function."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.loading import ConfigError

JUDGE_RUBRIC = "Question: {question}\nAnswer: {completion}\nIs the answer correct? Reply with one word: yes or no."
JudgeVerdict = Literal["logprob", "text"]
RewardModelDtype = Literal["float32", "bfloat16", "float16"]


@dataclass
class JudgeConfig:
    """An LLM judge as the reward (`arealite.reward.judge.JudgeReward`, docs/reward_models.md): never trained."""

    path: str = setting(
        "",
        "HF model folder of the judge: the local launcher serves it on a built-in server of its own (never "
        "weight-synced), and its tokenizer renders the chat template; empty: address must be set",
    )
    address: str = setting(
        "",
        "host:port[,host:port] of judge servers that already run (SGLang or built-in); empty: the launcher's "
        "server of path",
    )
    rubric: str = setting(
        JUDGE_RUBRIC,
        "the judge's instruction, a format string with {question} (the last user message), {completion}, {prompt} "
        "and any record field (e.g. {answer} for a reference-guided judge)",
    )
    chat_template: bool = setting(
        True,
        "send the rubric as a user turn through the judge tokenizer's chat template (needs path); false: the rubric "
        "is the whole prompt text, chat markup included",
    )
    verdict: JudgeVerdict = setting(
        "logprob",
        "logprob: P(yes) / (P(yes) + P(no)) of the first reply token, a graded score in [0, 1]; text: a greedy "
        "reply, read as `VERDICT: yes|no`, `score: N` (N / max_score) or a bare yes/no",
    )
    yes: list[str] = setting(factory=lambda: ["yes"], help="words that approve (any case, any leading space)")
    no: list[str] = setting(factory=lambda: ["no"], help="words that reject")
    top_logprobs: int = setting(20, "verdict=logprob: first-token candidates searched for yes / no tokens")
    max_new_tokens: int = setting(32, "verdict=text: budget of the judge's reply")
    max_score: float = setting(10.0, "verdict=text: `score: N` is scaled to N / max_score")
    timeout: float = setting(
        60.0,
        "seconds one batched judge request may take; past it each of its samples is a failed reward "
        "(RewardTimeout), never a 0",
    )
    max_batch_size: int = setting(64, "samples per judge request")
    max_wait: float = setting(0.02, "seconds a sample waits for others to share its request")
    max_concurrency: int = setting(4, "judge requests in flight at once, per trainer process")

    def __post_init__(self) -> None:
        check_choices(self, "judge")
        if not self.path and not self.address:
            raise ConfigError(
                "judge needs a model: set judge.path=DIR (the launcher serves it) or judge.address=host:port"
            )
        if self.chat_template and not self.path:
            raise ConfigError(
                "judge.chat_template=true renders with the judge's tokenizer, but judge.path is empty; set "
                "judge.path=DIR, or judge.chat_template=false and write the chat markup into judge.rubric"
            )
        if not self.yes or not self.no:
            raise ConfigError(f"judge.yes={self.yes} and judge.no={self.no} must each name at least one word")
        for name in ("top_logprobs", "max_new_tokens", "max_score", "timeout", "max_batch_size", "max_concurrency"):
            check_positive("judge", name, getattr(self, name))
        check_positive("judge", "max_wait", self.max_wait, allow_zero=True)


@dataclass
class RewardModelConfig:
    """A scalar reward model (`AutoModelForSequenceClassification`) as the reward (`arealite.reward.classifier`)."""

    path: str = setting("", "HF folder of the classifier; loaded once per trainer process, never trained")
    device: str = setting("cpu", "where it runs: cpu | cuda | cuda:N | auto (cuda when available)")
    dtype: RewardModelDtype = setting("float32", "the classifier's dtype")
    template: str = setting(
        "",
        "the classifier's input, a format string with {question}, {completion}, {prompt} and record fields; empty: "
        "its tokenizer's chat template over [user: question, assistant: completion] (else question + ' ' + "
        "completion)",
    )
    positive_label: int = setting(
        1,
        "num_labels > 1: the reward is this class's softmax probability; num_labels == 1: the reward is the logit "
        "itself",
    )
    max_length: int = setting(1024, "tokens per input; longer inputs keep their end (the completion)")
    max_batch_size: int = setting(32, "samples per forward pass")
    max_wait: float = setting(0.02, "seconds a sample waits for others to share its forward pass")
    timeout: float = setting(
        60.0, "seconds one batched forward pass may take; past it each of its samples is a failed reward"
    )

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("reward_model.path is empty; set it to an AutoModelForSequenceClassification folder")
        check_choices(self, "reward_model")
        if not (self.device in ("cpu", "cuda", "auto") or self.device.startswith("cuda:")):
            raise ConfigError(f"reward_model.device={self.device!r} is not supported; use cpu, cuda, cuda:N or auto")
        for name in ("max_length", "max_batch_size", "timeout"):
            check_positive("reward_model", name, getattr(self, name))
        check_positive("reward_model", "max_wait", self.max_wait, allow_zero=True)
        check_positive("reward_model", "positive_label", self.positive_label, allow_zero=True)

"""How samples are drawn: `GenerationHyperparameters` (the one home of `group_size`,
`temperature`, `max_new_tokens`), read by the rollout client and the trainer's logprobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from arealite.config.fields import check_choices, check_positive, setting
from arealite.config.loading import ConfigError

if TYPE_CHECKING:
    from arealite.algo.truncation import Truncation

GREEDY_TEMPERATURE = 1e-6  # below it, sampling is greedy (SGLang's rule)
TruncationRule = Literal["joint", "sequential"]  # the servers' two rules (arealite/algo/truncation.py)


@dataclass
class GenerationHyperparameters:
    """Sampling settings for rollouts (`rollout.protocol.sampling_params` turns them into SGLang's)."""

    group_size: int = setting(4, "samples per prompt (GRPO group); also the group of group-relative advantages")
    max_new_tokens: int = setting(64, "budget of generated tokens per sample; also the budget of the overlong penalty")
    min_new_tokens: int = setting(
        0,
        "EOS/stop is suppressed until this many tokens are out (each turn's answer from its own start); the "
        "trainer replays the suppression on those tokens, marked stop_banned in the batch (docs/protocol.md §1.6.1)",
    )
    temperature: float = setting(1.0, "< 1e-6 means greedy, as in SGLang; the trainer's logprobs use it too")
    top_p: float = setting(1.0, "nucleus sampling: keep the smallest set of tokens with this much probability")
    top_k: int = setting(-1, "-1: whole vocabulary")
    stop_token_ids: list[int] = setting(factory=list, help="extra stop ids besides EOS")
    stop: list[str] = setting(factory=list, help="stop strings")
    frequency_penalty: float = setting(0.0, "subtracted from a token's logit once per earlier occurrence (SGLang's)")
    sampling_seed: int | None = setting(
        None,
        "base of per-sample seeds (reproducible sampling); None: the experiment's `seed` (server-chosen "
        "outside an experiment)",
    )
    min_p: float = setting(0.0, "drop tokens less likely than min_p times the most likely one")
    truncated_logprobs: bool = setting(
        True,
        "with top_p / top_k / min_p truncating: behaviour logprobs (asked of the server as "
        "`processed_logprobs`) and the trainer's logprobs are those of the truncated, renormalised "
        "distribution tokens are drawn from; false: full-vocabulary log_softmax(logits / T) on both sides "
        "(SGLang's and verl's, TRL's, AReaL's convention), which is all a real SGLang server reports "
        "(docs/protocol.md §1.6)",
    )
    truncation_rule: TruncationRule | None = setting(
        None,
        "how the trainer's logprobs combine top_k / top_p / min_p, which must be the serving backend's: "
        "joint (the built-in server's and SGLang's: all three tests on softmax(logits / T)) | sequential (min_p, "
        "then top_k, then top_p on the renormalised remainder); None: server.backend's rule (docs/backends.md; "
        "filled in by the experiment config; outside one the trainer replays joint, and a client whose backend "
        "truncates otherwise refuses it). verl, TRL and SkyRL recompute full-vocabulary logprobs against the "
        "engine's truncated ones (docs/protocol.md §1.6.1)",
    )

    def __post_init__(self) -> None:
        check_choices(self, "gconfig")
        check_positive("gconfig", "group_size", self.group_size)
        check_positive("gconfig", "max_new_tokens", self.max_new_tokens)
        check_positive("gconfig", "temperature", self.temperature, allow_zero=True)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"gconfig.top_p={self.top_p} must be in (0, 1]")
        if self.top_k != -1 and self.top_k < 1:
            raise ConfigError(f"gconfig.top_k={self.top_k} must be -1 (whole vocabulary) or >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            raise ConfigError(f"gconfig.min_p={self.min_p} must be in [0, 1]")

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the logprobs a server reports, which the trainer must reproduce:
        the sampling temperature, or 1 for greedy sampling (SGLang's greedy rewrite)."""
        return 1.0 if self.temperature < GREEDY_TEMPERATURE else self.temperature

    @property
    def truncates_logprobs(self) -> bool:
        """Whether behaviour and trainer logprobs are of a truncated distribution (`logprob_truncation`
        is not None), decided without building the truncation (which imports torch)."""
        cuts = self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0
        return cuts and self.truncated_logprobs and self.temperature >= GREEDY_TEMPERATURE

    @property
    def logprob_truncation(self) -> Truncation | None:
        """The truncation the trainer's logprobs apply, or None for full-vocabulary logprobs:
        nothing truncates, `truncated_logprobs` is off, or sampling is greedy (which keeps
        SGLang's temperature-1 logprobs: greedy runs evaluate, they do not train off-policy)."""
        from arealite.algo.truncation import TOP_K_ALL, Truncation  # imports torch: launchers must not

        truncation = Truncation(self.top_k, self.top_p, self.min_p, self.truncation_rule or "joint")
        greedy = self.temperature < GREEDY_TEMPERATURE
        if greedy or not self.truncated_logprobs or not truncation.cuts(TOP_K_ALL):
            return None
        return truncation

"""On-policy distillation (`DistillConfig`): a teacher model scores the student's own samples."""

from __future__ import annotations

from dataclasses import dataclass

from arealite.config.fields import check_positive, setting
from arealite.config.loading import ConfigError


@dataclass
class DistillConfig:
    """On-policy distillation (`arealite.rollout.teacher.TeacherClient`, docs/algorithms.md).

    The student (the actor) samples as in GRPO; the teacher, served beside it and never trained,
    returns the logprob of every sampled token given what precedes it, and each loss token's
    advantage becomes `kl_coef * (teacher_logp - logprobs) + reward_weight * A_reward`, through
    the configured PPO loss. `teacher_logp - logprobs` is minus the single-sample (k1) estimate of
    the reverse KL(student || teacher) at that token, with no discounting over later tokens
    (the Thinking Machines recipe, discount 0). Conventions against peers: it is an advantage, not
    a loss term (TRL's GKD trainer minimises a divergence as a loss); its sign is a reward's (higher
    where the teacher agrees more); `reward_weight` defaults to 0, pure distillation, where slime's
    OPD adds the teacher term to the reward's advantage (weight 1); the student side is the
    behaviour `logprobs` from the server that sampled, not the recomputed `prox_logp`, and the
    teacher scores at `gconfig.temperature`, as the behaviour logprobs were taken. Student and
    teacher must share a tokenizer (checked at start).
    """

    teacher_path: str = setting(
        "",
        "HF folder of the teacher: the local launcher serves it on distill.n_servers servers of its own (the "
        "servers' backend; never weight-synced), and the client checks its tokenizer against the student's; "
        "empty: address must be set",
    )
    address: str = setting(
        "",
        "host:port[,host:port] of teacher servers that already run (SGLang or built-in); empty: the launcher's "
        "servers of teacher_path (AREAL_TEACHER_SERVER_ADDRS)",
    )
    n_servers: int = setting(1, "teacher servers the local launcher starts (with teacher_path and no address)")
    kl_coef: float = setting(
        1.0, "weight of the distillation advantage teacher_logp - logprobs (per token; > 0 pulls toward the teacher)"
    )
    reward_weight: float = setting(
        0.0,
        "weight of the verifiable reward's advantage (as actor.* computes it: group baseline, whitening) added "
        "to the distillation advantage; 0: distillation alone",
    )
    max_batch_size: int = setting(64, "sequences per teacher /generate request (one request per chunk of a batch)")
    request_timeout: float = setting(
        600.0,
        "seconds one teacher request may take; past it the request is retried like a rollout's "
        "(rollout.request_retries, with a health probe that can take the server out of rotation)",
    )

    def __post_init__(self) -> None:
        if not self.teacher_path and not self.address:
            raise ConfigError(
                "distill needs a teacher: set distill.teacher_path=DIR (the launcher serves it) or "
                "distill.address=host:port of a running teacher server"
            )
        for name in ("n_servers", "max_batch_size", "request_timeout"):
            check_positive("distill", name, getattr(self, name))
        check_positive("distill", "kl_coef", self.kl_coef, allow_zero=True)
        check_positive("distill", "reward_weight", self.reward_weight, allow_zero=True)
        if self.kl_coef == 0 and self.reward_weight == 0:
            raise ConfigError(
                "distill.kl_coef and distill.reward_weight are both 0: nothing would be learnt; raise one"
            )

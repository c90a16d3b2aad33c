"""Recorded chat completions and the trajectory of a conversation built from them.

Every completion the chat client returns is recorded with what training needs: the prompt
tokens, the model's tokens with their behaviour logprobs and weight versions, and the
completion it continued (`parent`) when its prompt extends that completion's tokens. A
conversation is the chain of completions ending at its last one; its trajectory is one
sequence

    prompt | reply 1 | tool results, user turn ... | reply 2 | ...
    loss_mask:  0 |    1    |                0                 |    1    | ...

so only the model's own tokens are trained on (and carry logprobs and versions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from arealite.rollout.batch import trajectory_from_tokens


@dataclass
class CompletionRecord:
    """One choice of one chat completion, as generated."""

    id: str  # "<completion id>-<choice index>"
    messages: list[dict[str, Any]]  # the request's messages, in template form
    tools: list[dict[str, Any]] | None
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]  # [len(output_ids)], behaviour logprobs from the server
    versions: list[int]  # [len(output_ids)], weight version of each output token
    stop_reason: str  # stop | length
    message: dict[str, Any]  # the assistant message returned, in template form
    parent: CompletionRecord | None = None  # the completion whose tokens `prompt_ids` extends
    extra: dict[str, Any] = field(default_factory=dict)

    def chain(self) -> list[CompletionRecord]:
        """The conversation's completions, first to last (this one)."""
        out, node = [], self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


def conversation_tokens(last: CompletionRecord) -> tuple[list[int], list[int], list[float], list[int], list[int]]:
    """(prompt ids, output ids, logprobs, versions, loss mask) of the conversation ending at `last`.

    The output holds every reply of the chain and, between them, the tokens the client
    inserted (end of turn, tool results, user turns) with loss mask 0, logprob 0, version -1.
    """
    chain = last.chain()
    prompt = list(chain[0].prompt_ids)
    out: list[int] = []
    logp: list[float] = []
    vers: list[int] = []
    mask: list[int] = []
    for c in chain:
        seen = prompt + out
        if c.prompt_ids[: len(seen)] != seen:
            raise ValueError(
                f"completion {c.id}'s prompt does not extend the conversation before it token for token; "
                "it cannot be one training sequence"
            )
        inserted = c.prompt_ids[len(seen) :]
        out += inserted + c.output_ids
        logp += [0.0] * len(inserted) + list(c.logprobs)
        vers += [-1] * len(inserted) + list(c.versions)
        mask += [0] * len(inserted) + [1] * len(c.output_ids)
    return prompt, out, logp, vers, mask


def conversation_trajectory(last: CompletionRecord, reward: float) -> dict[str, torch.Tensor]:
    """The trajectory (one row, `[1, T]` tensors plus `rewards` `[1]`) of the conversation ending at `last`."""
    prompt, out, logp, vers, mask = conversation_tokens(last)
    traj = trajectory_from_tokens([prompt], [out], [logp], [vers], output_loss_mask=[mask])
    traj["rewards"] = torch.tensor([float(reward)], dtype=torch.float32)  # [1]
    return traj

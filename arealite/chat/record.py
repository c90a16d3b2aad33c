"""Recorded chat completions and the trajectory of a conversation built from them.

Every completion the chat client returns is recorded with what training needs: the prompt
tokens, the model's tokens with their behaviour logprobs and weight versions, and the
completion it continued (`parent`) when its prompt extends that completion's tokens. A
conversation is the chain of completions ending at its last one; its trajectory is one
sequence

    prompt | reply 1 | tool results, user turn ... | reply 2 | ...
    loss_mask:  0 |    1    |                0                 |    1    | ...

so only the model's own tokens are trained on (and carry logprobs and versions). A session
whose requests did not all extend one conversation token for token (a template that drops
earlier reasoning, a compacted or rewritten history, a branch) has several chains:
`episode_trajectory` makes each its own row, every completion trained in exactly one of them,
with `turn_ids` (a completion's turn index is its position in the session) and `chain`.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    # [len(output_ids)]: sampled under gconfig.min_new_tokens's stop ban; None: asked without one
    stop_banned: list[bool] | None = None
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
    return _chain_tokens(last, None, {})[:5]


def _chain_tokens(
    last: CompletionRecord, trained: set[int] | None, turn_of: dict[int, int]
) -> tuple[list[int], list[int], list[float], list[int], list[int], list[int], list[bool]]:
    """`conversation_tokens` plus each output token's turn (`turn_of[id(completion)]`, -1 elsewhere)
    and whether it was sampled under min_new_tokens's stop ban (`CompletionRecord.stop_banned`).
    A completion already in `trained` (trained in another row) gets loss mask 0 and turn -1 here;
    the ones trained here are added to it."""
    chain = last.chain()
    prompt = list(chain[0].prompt_ids)
    out: list[int] = []
    logp: list[float] = []
    vers: list[int] = []
    mask: list[int] = []
    turns: list[int] = []
    banned: list[bool] = []
    for c in chain:
        seen = prompt + out
        if c.prompt_ids[: len(seen)] != seen:
            raise ValueError(
                f"completion {c.id}'s prompt does not extend the conversation before it token for token; "
                "it cannot be one training sequence"
            )
        inserted = c.prompt_ids[len(seen) :]
        own = trained is None or id(c) not in trained
        if trained is not None:
            trained.add(id(c))
        n = len(c.output_ids)
        out += inserted + c.output_ids
        logp += [0.0] * len(inserted) + list(c.logprobs)
        vers += [-1] * len(inserted) + list(c.versions)
        mask += [0] * len(inserted) + [int(own)] * n
        turns += [-1] * len(inserted) + [turn_of.get(id(c), -1) if own else -1] * n
        banned += [False] * len(inserted) + (list(c.stop_banned) if c.stop_banned is not None else [False] * n)
    return prompt, out, logp, vers, mask, turns, banned


def _banned_rows(records: list[CompletionRecord], rows: list[list[bool]]) -> list[list[bool]] | None:
    """The rows' stop_banned flags when any completion was asked with min_new_tokens, else None (no key)."""
    return rows if any(c.stop_banned is not None for c in records) else None


def conversation_trajectory(last: CompletionRecord, reward: float) -> dict[str, torch.Tensor]:
    """The trajectory (one row, `[1, T]` tensors plus `rewards` `[1]`) of the conversation ending at `last`."""
    prompt, out, logp, vers, mask, _, banned = _chain_tokens(last, None, {})
    traj = trajectory_from_tokens(
        [prompt], [out], [logp], [vers], output_loss_mask=[mask],
        output_stop_banned=_banned_rows(last.chain(), [banned]),
    )  # fmt: skip
    traj["rewards"] = torch.tensor([float(reward)], dtype=torch.float32)  # [1]
    return traj


def episode_trajectory(
    completions: list[CompletionRecord], turn_rewards: Sequence[float] | None = None, reward: float = 0.0
) -> dict[str, torch.Tensor]:
    """A session's completions (in the order made) as training rows: one per chain, ending at each
    completion no later one continued, every completion's tokens trained in exactly one row.

    Turn k is `completions[k]`; its reward is `turn_rewards[k]` (default 0), plus `reward` on the
    last turn. Adds `turn_ids`, `turn_rewards` [R, T], `chain` [R] (0, 1, ...) and `rewards` [R]:
    the episode's return (`reward + sum(turn_rewards)`) on every row."""
    if not completions:
        raise ValueError("no completions: an episode needs at least one")
    n = len(completions)
    per_turn = [0.0] * n if turn_rewards is None else [float(r) for r in turn_rewards]
    if len(per_turn) != n:
        raise ValueError(f"{len(per_turn)} turn rewards for {n} completions; give one per completion, in order")
    per_turn[-1] += float(reward)
    turn_of = {id(c): k for k, c in enumerate(completions)}
    parents = {id(c.parent) for c in completions if c.parent is not None}
    leaves = [c for c in completions if id(c) not in parents]
    trained: set[int] = set()
    rows = []
    for leaf in leaves:
        prompt, out, logp, vers, mask, turns, banned = _chain_tokens(leaf, trained, turn_of)
        here = {k for k in turns if k >= 0}
        rows.append((prompt, out, logp, vers, mask, turns, {k: per_turn[k] for k in here}, banned))
    _assign_orphans(rows, per_turn)
    traj = trajectory_from_tokens(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
        output_loss_mask=[r[4] for r in rows], output_turn_ids=[r[5] for r in rows],
        turn_rewards=[r[6] for r in rows], output_stop_banned=_banned_rows(completions, [r[7] for r in rows]),
    )  # fmt: skip
    traj["chain"] = torch.arange(len(rows), dtype=torch.long)
    traj["rewards"] = torch.full((len(rows),), sum(per_turn), dtype=torch.float32)
    return traj


def _assign_orphans(rows: list, per_turn: list[float]) -> None:
    """Turns with no token in any row (empty completions): their reward goes to the row holding the
    nearest earlier turn (`trajectory_from_tokens` puts it on that turn's last token)."""
    placed = {k for r in rows for k in r[6]}
    for k, r in enumerate(per_turn):
        if k in placed or not r:
            continue
        holders = [(max((t for t in row[6] if t < k), default=-1), i) for i, row in enumerate(rows)]
        best = max(holders)[1] if holders else None
        if best is not None:
            rows[best][6][k] = r

"""Reading a judge's verdict: from its reply text, or from the logprobs of its first token.

Pure functions, no I/O. Both return a score in [0, 1] or raise `VerdictError` naming what
the reply held, so an unparseable verdict is a failed reward (counted by the caller), never a 0.

- `text_verdict`: the last `VERDICT: yes|no` (any case, `:` or `=`), else the last
  `score: N` / `N/10` scaled by `max_score`, else a reply that is a bare yes or no word.
- `logprob_verdict`: P(yes) / (P(yes) + P(no)) over the first generated position's top
  logprobs, where yes and no are every token that reads as one of the words (` Yes`, `yes`,
  ...). A graded score: a tiny judge's confidence is signal, where its greedy word is a coin.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from arealite.reward.pool import RewardError

_VERDICT = re.compile(r"verdict\s*[:=]\s*\**\s*([a-z]+)", re.IGNORECASE)
_SCORE = re.compile(r"(?:score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?))|(?:(-?\d+(?:\.\d+)?)\s*/\s*10\b)", re.IGNORECASE)
_WORD = re.compile(r"[a-z]+", re.IGNORECASE)


class VerdictError(RewardError):
    """The judge's reply holds no verdict that can be read."""


def _word_class(word: str, yes: Sequence[str], no: Sequence[str]) -> float | None:
    w = word.strip().lower()
    if w in (y.lower() for y in yes):
        return 1.0
    if w in (n.lower() for n in no):
        return 0.0
    return None


def _token_class(token: str, yes: Sequence[str], no: Sequence[str]) -> float | None:
    """1.0 / 0.0 for a token that begins only yes words / only no words (`Yes`, ` yes`, and in a
    vocabulary without the whole word its first piece, `y`); None otherwise."""
    t = token.strip().lower()
    if not t:
        return None
    says_yes = any(y.lower().startswith(t) for y in yes)
    says_no = any(n.lower().startswith(t) for n in no)
    if says_yes == says_no:  # neither, or a prefix both share
        return None
    return 1.0 if says_yes else 0.0


def text_verdict(
    reply: str, yes: Sequence[str] = ("yes",), no: Sequence[str] = ("no",), max_score: float = 10.0
) -> float:
    """The score a judge's reply text states, in [0, 1]; VerdictError when it states none."""
    marked = _VERDICT.findall(reply)
    if marked:
        value = _word_class(marked[-1], yes, no)
        if value is not None:
            return value
    scores = _SCORE.findall(reply)
    if scores:
        number = float(next(s for s in scores[-1] if s))
        if not 0.0 <= number <= max_score:
            raise VerdictError(f"judge score {number} is outside 0..{max_score}; reply {reply[:200]!r}")
        return number / max_score
    words = _WORD.findall(reply)
    if len(words) == 1:  # a bare "Yes." or "no"
        value = _word_class(words[0], yes, no)
        if value is not None:
            return value
    raise VerdictError(
        f"judge reply {reply[:200]!r} has no verdict: expected 'VERDICT: yes|no', 'score: N' (of {max_score}) "
        f"or a bare {list(yes)}/{list(no)} word; tighten the rubric or raise judge.max_new_tokens"
    )


def logprob_verdict(
    top_logprobs: Sequence[Sequence], yes: Sequence[str] = ("yes",), no: Sequence[str] = ("no",)
) -> float:
    """P(yes) / (P(yes) + P(no)) from one position's `[logprob, token_id, text]` triples.

    VerdictError when neither a yes nor a no token is among them (the judge would say
    something else: raise judge.top_logprobs, or fix the rubric).
    """
    p_yes = p_no = 0.0
    for entry in top_logprobs:
        logprob, text = float(entry[0]), entry[2]
        if text is None:
            raise VerdictError("the judge's top logprobs carry no token text; send return_text_in_logprobs=true")
        value = _token_class(text, yes, no)
        if value == 1.0:
            p_yes += math.exp(logprob)
        elif value == 0.0:
            p_no += math.exp(logprob)
    if p_yes + p_no <= 0.0:
        shown = [e[2] for e in top_logprobs[:5]]
        raise VerdictError(
            f"no {list(yes)} or {list(no)} token among the judge's {len(top_logprobs)} most likely first tokens "
            f"(top: {shown}); raise judge.top_logprobs or fix the rubric"
        )
    return p_yes / (p_yes + p_no)

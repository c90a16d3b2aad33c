"""The final number of a free-form answer, checked against the reference: the reward for an
instruct model asked a question whose answer is a number.

An instruct model asked "What is 27 + 82? Reply with only the number." writes `109`,
`109.`, `The answer is 109.` or `27 + 82 = 109`; a check for the bare answer followed by EOS
(the toy task's, `arealite.data.arithmetic`) scores all but the first 0, which hides what the
model knows. This check reads the LAST number of the completion, so

- the working or an echo of the question may come before it (`27 + 82 = 109` scores 1);
- a sample commits to exactly one answer: listing candidates (`108 109 110`) scores only
  the last one, so guessing many numbers gains nothing over guessing one;
- a completion cut by the token budget scores 0 (its last number may be a prefix of a longer
  one, `10` of `109`), which makes ending the answer part of the task.

Numbers are integers or decimals, with an optional sign and thousands commas (`1,024`); they
compare by value (`109.0` equals `109`). Words (`one hundred nine`) do not count.
"""

from __future__ import annotations

import re
from typing import Any

# Not inside a word or after a decimal point, so `27-82` is 27 and 82 (a minus right after
# a digit is an operator) and `=-55` is -55.
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The value of the last number written in `text`, None when it has none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    return float(found[-1].replace(",", ""))


def final_number_reward_fn(
    prompt: str,
    completion: str,
    prompt_ids: Any = None,
    completion_ids: Any = None,
    answer: str = "",
    truncated: bool = False,
    **_: Any,
) -> float:
    """1.0 when the completion ended (not cut by the budget) and its last number equals `answer`."""
    gold = last_number(str(answer))
    if gold is None:
        raise ValueError(f"final_number_reward_fn got answer={answer!r}, which holds no number; records need one")
    if truncated:
        return 0.0
    predicted = last_number(completion)
    return 1.0 if predicted is not None and predicted == gold else 0.0

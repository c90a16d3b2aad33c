"""The final-number reward: what an instruct model writes scores by its last number only."""

import pytest

from arealite.reward.final_number import final_number_reward_fn, last_number


def _score(completion: str, answer: str = "109", truncated: bool = False) -> float:
    return final_number_reward_fn("What is 27 + 82?", completion, None, None, answer=answer, truncated=truncated)


@pytest.mark.parametrize(
    "completion", ["109", "109.", " 109\n", "The answer is 109.", "27 + 82 = 109", "**109**", "109.0", "$109"]
)
def test_the_ways_an_instruct_model_writes_the_answer_score(completion):
    assert _score(completion) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "198",  # wrong
        "27 + 82 = 198",  # wrong after an echo of the question
        "109 is wrong, it is 110",  # the last number is the answer given
        "108 109 110",  # listing candidates: only the last counts
        "109 apples and 2 pears",
        "one hundred nine",  # no number
        "",
        "1090",
        "10.9",
    ],
)
def test_only_the_last_number_counts(completion):
    assert _score(completion) == 0.0


def test_a_cut_answer_scores_zero_even_if_its_last_number_matches():
    assert _score("The answer is 109", truncated=True) == 0.0
    assert _score("The answer is 109", truncated=False) == 1.0


def test_signs_commas_and_operators():
    assert last_number("27-82=-55") == -55  # a minus after a digit is an operator, after `=` a sign
    assert last_number("27-82") == 82
    assert last_number("total: 1,024 apples") == 1024
    assert last_number("3, 4") == 4
    assert last_number("step2") is None  # a digit inside a word is no number
    assert _score("-5", answer="-5") == 1.0 and _score("5", answer="-5") == 0.0


def test_a_reference_without_a_number_is_refused():
    with pytest.raises(ValueError, match="answer='x'"):
        _score("1", answer="x")

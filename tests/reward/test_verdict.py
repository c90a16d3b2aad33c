"""Reading a judge's verdict: every accepted form gives its score, anything else is a VerdictError."""

import math

import pytest

from arealite.reward.verdict import VerdictError, logprob_verdict, text_verdict


@pytest.mark.parametrize(
    "reply, score",
    [
        ("VERDICT: yes", 1.0),
        ("The answer is right.\nverdict = NO", 0.0),
        ("Verdict: **Yes**", 1.0),
        ("first I thought VERDICT: no, but VERDICT: yes", 1.0),  # the last verdict counts
        ("Score: 7", 0.7),
        ("I would give it 4/10.", 0.4),
        ("score: 2.5 ... final score: 9", 0.9),
        ("Yes.", 1.0),
        (" no", 0.0),
    ],
)
def test_text_verdict_reads_each_form(reply, score):
    assert math.isclose(text_verdict(reply), score, rel_tol=1e-9)


@pytest.mark.parametrize("reply", ["", "maybe", "yes and no", "The answer looks fine to me", "VERDICT: perhaps"])
def test_text_without_a_verdict_is_an_error_naming_the_reply(reply):
    with pytest.raises(VerdictError, match="has no verdict"):
        text_verdict(reply)


def test_out_of_range_score_is_an_error():
    with pytest.raises(VerdictError, match="outside 0..10"):
        text_verdict("score: 12")


def test_custom_words_and_scale():
    assert text_verdict("VERDICT: good", yes=["good"], no=["bad"]) == 1.0
    assert math.isclose(text_verdict("score: 3", max_score=5), 0.6, rel_tol=1e-9)


def test_logprob_verdict_is_the_normalised_yes_probability():
    top = [[math.log(0.3), 1, " Yes"], [math.log(0.1), 2, "no"], [math.log(0.2), 3, "yes"], [math.log(0.4), 4, "x"]]
    assert math.isclose(logprob_verdict(top), 0.5 / 0.6, rel_tol=1e-9)


def test_logprob_verdict_counts_a_first_piece_of_the_word():
    """A vocabulary without `yes` spells it `y` + `es`: the first piece is the verdict."""
    top = [[math.log(0.6), 1, "y"], [math.log(0.2), 2, "n"], [math.log(0.2), 3, "7"]]
    assert math.isclose(logprob_verdict(top), 0.75, rel_tol=1e-9)


def test_a_piece_both_words_share_is_no_verdict():
    top = [[math.log(0.9), 1, "n"], [math.log(0.1), 2, "ye"]]
    assert math.isclose(logprob_verdict(top, yes=["yes"], no=["nope", "nah"]), 0.1, rel_tol=1e-9)
    with pytest.raises(VerdictError):
        logprob_verdict([[math.log(0.9), 1, "n"]], yes=["no way"], no=["nope"])  # "n" begins both


def test_no_yes_or_no_token_in_the_top_is_an_error():
    with pytest.raises(VerdictError, match="raise judge.top_logprobs"):
        logprob_verdict([[math.log(0.9), 1, "maybe"], [math.log(0.1), 2, " "]])


def test_missing_token_text_is_an_error():
    with pytest.raises(VerdictError, match="return_text_in_logprobs"):
        logprob_verdict([[-0.1, 1, None]])

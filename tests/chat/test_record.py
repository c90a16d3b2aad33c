"""A chain of recorded completions to one training sequence, the loss mask on model tokens only."""

import pytest

from arealite.chat.record import CompletionRecord, conversation_trajectory


def _rec(prompt, out, parent=None, version=3):
    return CompletionRecord(
        id=f"c{len(prompt)}", messages=[], tools=None, prompt_ids=prompt, output_ids=out,
        logprobs=[-0.5] * len(out), versions=[version] * len(out), stop_reason="stop", message={}, parent=parent,
    )  # fmt: skip


def test_chain_to_one_sequence():
    first = _rec([1, 2, 3], [10, 11], version=3)
    second = _rec([1, 2, 3, 10, 11, 20, 21, 22], [12], parent=first, version=4)
    traj = conversation_trajectory(second, reward=0.5)
    assert traj["input_ids"].tolist() == [[1, 2, 3, 10, 11, 20, 21, 22, 12]]
    assert traj["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 1]]
    assert traj["versions"].tolist() == [[-1, -1, -1, 3, 3, -1, -1, -1, 4]]
    assert traj["logprobs"].tolist() == [[0, 0, 0, -0.5, -0.5, 0, 0, 0, -0.5]]
    assert traj["rewards"].tolist() == [0.5]


def test_a_prompt_that_does_not_extend_its_parent_is_refused():
    first = _rec([1, 2, 3], [10, 11])
    second = _rec([1, 2, 3, 10, 99, 20], [12], parent=first)  # the reply re-tokenized differently
    with pytest.raises(ValueError, match="does not extend the conversation"):
        conversation_trajectory(second, 1.0)

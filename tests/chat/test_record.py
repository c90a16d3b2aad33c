"""A chain of recorded completions to one training sequence, the loss mask on model tokens only."""

import pytest

from arealite.chat.record import CompletionRecord, conversation_trajectory, episode_trajectory


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


def test_min_new_tokens_marks_reach_the_trajectory_per_completion():
    """Each completion's own stop-ban marks (the chat client's `ModelResponse.output_stop_banned` under
    `gconfig.min_new_tokens`) land on its tokens; inserted tokens and a row trained elsewhere get none."""
    first = _rec([1, 2, 3], [10, 11, 12])
    first.stop_banned = [True, True, False]
    second = _rec([1, 2, 3, 10, 11, 12, 20], [13, 14], parent=first)
    second.stop_banned = [True, True]
    traj = conversation_trajectory(second, reward=0.0)
    assert traj["stop_banned"].tolist() == [[False] * 3 + [True, True, False, False, True, True]]
    branch = _rec([1, 2, 3, 10, 11, 12, 30], [15], parent=first)
    branch.stop_banned = [True]
    rows = episode_trajectory([first, second, branch])["stop_banned"].tolist()
    assert rows == [[False] * 3 + [True, True, False, False, True, True], [False] * 7 + [True, False]]
    assert "stop_banned" not in conversation_trajectory(_rec([1, 2], [10]), reward=0.0)  # asked without a ban


def test_a_prompt_that_does_not_extend_its_parent_is_refused():
    first = _rec([1, 2, 3], [10, 11])
    second = _rec([1, 2, 3, 10, 99, 20], [12], parent=first)  # the reply re-tokenized differently
    with pytest.raises(ValueError, match="does not extend the conversation"):
        conversation_trajectory(second, 1.0)


def test_an_episode_of_several_chains_trains_every_completion_once():
    # 0 -> 1 continue token for token; 2 was rendered afresh (its history was not a prefix), 3 continues 2;
    # 4 branches off 0 (a second choice continuing the same reply)
    c0 = _rec([1, 2], [10, 11])
    c1 = _rec([1, 2, 10, 11, 5], [12], parent=c0)
    c2 = _rec([1, 2, 7, 12, 5], [13, 14])  # earlier reply re-rendered without what the template dropped
    c3 = _rec([1, 2, 7, 12, 5, 13, 14, 6], [15], parent=c2)
    c4 = _rec([1, 2, 10, 11, 8], [16, 17], parent=c0)
    traj = episode_trajectory([c0, c1, c2, c3, c4], turn_rewards=[0.1, 0.2, 0.3, 0.0, 0.5], reward=1.0)
    assert traj["chain"].tolist() == [0, 1, 2]  # leaves in the order made: c1, c3, c4
    ids, turn_ids, mask = traj["input_ids"].tolist(), traj["turn_ids"].tolist(), traj["loss_mask"].tolist()
    trained = sorted(tok for row, m in zip(ids, mask) for tok, keep in zip(row, m) if keep)
    assert trained == [10, 11, 12, 13, 14, 15, 16, 17]  # every model token exactly once
    assert turn_ids[0][:6] == [-1, -1, 0, 0, -1, 1]
    assert turn_ids[1][:8] == [-1, -1, -1, -1, -1, 2, 2, -1] and turn_ids[1][8] == 3
    assert turn_ids[2][:7] == [-1, -1, -1, -1, -1, 4, 4]  # c0's tokens are trained in row 0, not again here
    assert (traj["turn_ids"] >= 0).eq(traj["loss_mask"].bool()).all()
    rew = traj["turn_rewards"]
    assert rew[0].tolist()[:6] == pytest.approx([0, 0, 0, 0.1, 0, 0.2])  # on each turn's last token
    assert rew[1, 6].item() == pytest.approx(0.3) and rew[1, 8].item() == 0.0
    assert rew[2, 6].item() == pytest.approx(1.5)  # the last turn's 0.5, plus the episode's reward 1.0
    assert traj["rewards"].tolist() == pytest.approx([2.1] * 3)  # the episode's return on every row


def test_a_turn_without_tokens_gives_its_reward_to_the_turn_before():
    c0 = _rec([1, 2], [10, 11])
    c1 = _rec([1, 2, 10, 11, 5], [], parent=c0)  # an empty completion
    traj = episode_trajectory([c0, c1], turn_rewards=[0.25, 0.0], reward=1.0)
    assert traj["turn_rewards"].sum().item() == pytest.approx(1.25)
    assert traj["turn_rewards"][0, 3].item() == pytest.approx(1.25)  # c0's last token


def test_turn_rewards_must_match_the_completions():
    with pytest.raises(ValueError, match="one per completion"):
        episode_trajectory([_rec([1], [2])], turn_rewards=[0.0, 1.0])

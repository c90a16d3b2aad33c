"""Building and stacking padded trajectory batches (docs/architecture.md §5 convention)."""

import pytest
import torch

from arealite.rollout.batch import concat_padded, trajectory_from_tokens


def test_trajectory_from_tokens_layout():
    traj = trajectory_from_tokens(
        prompt_ids=[[1, 2], [3]],
        output_ids=[[4, 5, 6], [7]],
        output_logprobs=[[-0.1, -0.2, -0.3], [-0.4]],
        output_versions=[[0, 0, 1], [2]],
    )
    assert traj["input_ids"].tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    assert traj["attention_mask"].tolist() == [[True] * 5, [True, True, False, False, False]]
    assert traj["loss_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 1, 0, 0, 0]]
    assert torch.allclose(traj["logprobs"], torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -0.4, 0, 0, 0]]))
    assert traj["versions"].tolist() == [[-1, -1, 0, 0, 1], [-1, 2, -1, -1, -1]]


def test_loss_mask_excludes_non_model_tokens():
    traj = trajectory_from_tokens([[1]], [[2, 3, 4]], [[-1.0, -2.0, -3.0]], [[5, 5, 5]], output_loss_mask=[[1, 0, 1]])
    assert traj["loss_mask"].tolist() == [[0, 1, 0, 1]]
    assert traj["logprobs"].tolist() == [[0.0, -1.0, 0.0, -3.0]]
    assert traj["versions"].tolist() == [[-1, 5, -1, 5]]


def test_misaligned_outputs_are_rejected():
    with pytest.raises(ValueError, match="2 output tokens but 1 logprobs"):
        trajectory_from_tokens([[1]], [[2, 3]], [[-1.0]], [[0, 0]])


def test_concat_pads_per_key():
    a = trajectory_from_tokens([[1]], [[2]], [[-1.0]], [[0]])
    a["rewards"] = torch.tensor([1.0])
    b = trajectory_from_tokens([[1, 2, 3]], [[4]], [[-1.0]], [[1]])
    b["rewards"] = torch.tensor([0.0])
    batch = concat_padded([a, b])
    assert batch["input_ids"].shape == (2, 4)
    assert batch["versions"][0].tolist() == [-1, 0, -1, -1]  # versions pad with -1
    assert batch["attention_mask"][0].tolist() == [True, True, False, False]
    assert batch["rewards"].tolist() == [1.0, 0.0]


def test_concat_rejects_mismatched_keys():
    a = trajectory_from_tokens([[1]], [[2]], [[-1.0]], [[0]])
    b = dict(a, rewards=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="trajectory 1 has keys"):
        concat_padded([a, b])

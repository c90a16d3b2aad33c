"""Building and stacking padded trajectory batches (docs/architecture.md §5 convention)."""

import random

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


def _naive_trajectory(prompts, outputs, logprobs, versions, masks):
    """trajectory_from_tokens as a plain loop over tokens, the reference."""
    width = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    rows = {k: [] for k in ("input_ids", "attention_mask", "loss_mask", "logprobs", "versions")}
    for p, o, lp, v, m in zip(prompts, outputs, logprobs, versions, masks):
        pad = width - len(p) - len(o)
        m = [1] * len(o) if m is None else m
        rows["input_ids"].append(list(p) + list(o) + [0] * pad)
        rows["attention_mask"].append([True] * (len(p) + len(o)) + [False] * pad)
        rows["loss_mask"].append([0] * len(p) + list(m) + [0] * pad)
        rows["logprobs"].append([0.0] * len(p) + [x if k else 0.0 for x, k in zip(lp, m)] + [0.0] * pad)
        rows["versions"].append([-1] * len(p) + [x if k else -1 for x, k in zip(v, m)] + [-1] * pad)
    return rows


@pytest.mark.parametrize("with_mask", [False, True])
def test_trajectory_from_tokens_matches_a_naive_loop(with_mask):
    # Samples of one version (the fast path), of several, empty outputs, tuples and lists.
    rng = random.Random(0)
    for _ in range(200):
        b = rng.randint(1, 4)
        prompts = [[rng.randint(0, 99) for _ in range(rng.randint(1, 6))] for _ in range(b)]
        outputs = [[rng.randint(0, 99) for _ in range(rng.randint(0, 6))] for _ in range(b)]
        logprobs = [[-rng.randint(1, 8) / 4 for _ in o] for o in outputs]
        versions = [
            [rng.choice([2, 3])] * len(o) if rng.random() < 0.5 else [rng.choice([2, 3]) for _ in o] for o in outputs
        ]
        versions = [tuple(v) if rng.random() < 0.3 else v for v in versions]
        masks = [[rng.randint(0, 1) for _ in o] for o in outputs] if with_mask else [None] * b
        traj = trajectory_from_tokens(prompts, outputs, logprobs, versions, masks if with_mask else None)
        want = _naive_trajectory(prompts, outputs, logprobs, versions, masks)
        assert {k: t.tolist() for k, t in traj.items()} == want


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

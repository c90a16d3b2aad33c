"""The scalar reward model: a real tiny `Qwen2ForSequenceClassification`, loaded once per process,
scoring batches exactly as it scores one input at a time (padding included), with one label
(the logit) or several (a class probability); its failures are counted, never scored 0."""

import asyncio
import math
import pickle

import pytest
import torch

from arealite.config import ConfigError, RewardModelConfig
from arealite.reward.classifier import ClassifierReward, load_classifier
from arealite.reward.pool import RewardError, RewardPool
from arealite.workflow.scoring import Scorer

pytestmark = pytest.mark.timeout(180)
RECORD = {"messages": [{"role": "user", "content": "3+4="}], "answer": "7"}
COMPLETIONS = ["7", "8", "the answer is 17", "", "7 7 7 7 7 7 7 7"]  # different lengths: padded in one batch


def build_classifier(tokenizer_dir: str, out_dir: str, num_labels: int) -> str:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = Qwen2Config.from_pretrained(tokenizer_dir, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(3)
    Qwen2ForSequenceClassification(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def scalar_rm(tiny_model_dir, tmp_path_factory):
    return build_classifier(tiny_model_dir, str(tmp_path_factory.mktemp("rm1")), num_labels=1)


@pytest.fixture(scope="module")
def binary_rm(tiny_model_dir, tmp_path_factory):
    return build_classifier(tiny_model_dir, str(tmp_path_factory.mktemp("rm2")), num_labels=2)


def score_all(reward, completions):
    async def run():
        return await asyncio.gather(*(reward.ascore("p", c, **RECORD) for c in completions))

    return asyncio.run(run())


def one_at_a_time(path: str, text: str) -> torch.Tensor:
    model, tokenizer = load_classifier(path)
    with torch.no_grad():
        return model(**tokenizer([text], return_tensors="pt")).logits[0].float()


def test_one_label_rewards_are_the_logits_and_batching_changes_nothing(scalar_rm):
    reward = ClassifierReward(RewardModelConfig(path=scalar_rm, max_wait=0.5))
    scores = score_all(reward, COMPLETIONS)
    for completion, score in zip(COMPLETIONS, scores):
        want = one_at_a_time(scalar_rm, reward.render("p", completion, RECORD))[0].item()
        assert math.isclose(score, want, rel_tol=1e-4, abs_tol=1e-6), completion
    assert len({round(s, 5) for s in scores}) == len(COMPLETIONS)


def test_several_labels_give_the_positive_class_probability(binary_rm):
    reward = ClassifierReward(
        RewardModelConfig(path=binary_rm, positive_label=0, template="{question} => {completion}")
    )
    assert reward.render("p", "8", RECORD) == "3+4= => 8"
    got = reward("p", "8", **RECORD)
    want = one_at_a_time(binary_rm, "3+4= => 8").softmax(-1)[0].item()
    assert math.isclose(got, want, rel_tol=1e-5)


def test_default_input_is_the_chat_template_over_question_and_answer(scalar_rm):
    text = ClassifierReward(RewardModelConfig(path=scalar_rm)).render("p", "8", RECORD)
    assert text.startswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n8<|im_end|>")


def test_concurrent_samples_share_a_forward_pass(scalar_rm):
    reward = ClassifierReward(RewardModelConfig(path=scalar_rm, max_batch_size=2, max_wait=0.5))

    async def run():
        scores = await asyncio.gather(*(reward.ascore("p", c, **RECORD) for c in COMPLETIONS))
        return scores, reward._batchers[asyncio.get_running_loop()].batches

    scores, batches = asyncio.run(run())
    assert batches == 3 and len(scores) == 5  # 5 samples, 2 a pass


def test_model_is_loaded_once_per_process(scalar_rm):
    assert load_classifier(scalar_rm)[0] is load_classifier(scalar_rm, "cpu", "float32")[0]


def test_failures_are_counted_not_zero(binary_rm):
    reward = ClassifierReward(RewardModelConfig(path=binary_rm, positive_label=5))
    stats: dict[str, int] = {}
    scorer = Scorer(reward, RewardPool(max_workers=1), "reject", stats)
    assert asyncio.run(scorer.score("p", "7", [1], [2], RECORD)) is None
    assert stats["reward_errors"] == 1
    with pytest.raises(RewardError, match="positive_label=5, but the model has 2 labels"):
        reward("p", "7", **RECORD)
    missing = ClassifierReward(RewardModelConfig(path=binary_rm, template="{reference} {completion}"))
    with pytest.raises(RewardError, match="names 'reference'"):
        missing("p", "7", **RECORD)


def test_pickled_reward_model_scores_alike(scalar_rm):
    reward = ClassifierReward(RewardModelConfig(path=scalar_rm))
    assert math.isclose(
        pickle.loads(pickle.dumps(reward))("p", "7", **RECORD), reward("p", "7", **RECORD), rel_tol=1e-6
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({}, "reward_model.path is empty"),
        ({"path": "m", "device": "tpu"}, "reward_model.device='tpu' is not supported"),
        ({"path": "m", "dtype": "int8"}, "reward_model.dtype='int8' is not supported"),
        ({"path": "m", "max_batch_size": 0}, "reward_model.max_batch_size=0 must be > 0"),
    ],
)
def test_reward_model_config_errors_name_the_fix(settings, message):
    with pytest.raises(ConfigError, match=message):
        RewardModelConfig(**settings)

"""The LLM judge against a real built-in server: graded scores equal to the judge model's own
probabilities, concurrent samples batched, and every failure (an unreadable verdict, a server
that does not answer in time or at all, a rubric field the record lacks) counted as a failed
reward by the workflow's scorer, never scored 0."""

import asyncio
import json
import math
import pickle
from pathlib import Path

import pytest
import torch

from arealite.config import ConfigError, GRPOConfig, JudgeConfig
from arealite.reward.judge import JudgeReward, judge_addresses
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout
from arealite.reward.verdict import VerdictError
from arealite.server.process import launch_server_process
from arealite.utils.net import JUDGE_ADDRS_ENV, free_ports
from arealite.workflow.scoring import Scorer

pytestmark = pytest.mark.timeout(240)
RUBRIC = "Question: {question}\nAnswer: {completion}\nIs it right? yes or no."
RECORD = {"messages": [{"role": "user", "content": "3+4="}], "answer": "7"}
COMPLETIONS = ["7", "8", "17", "twelve", "", "7 7 7"]


@pytest.fixture(scope="module")
def judge_server(tiny_model_dir):
    # the whole vocabulary in the top logprobs: every yes and no token is seen, so a random model's verdict is readable
    with launch_server_process(tiny_model_dir, extra_args=["--max-top-logprobs-num", "1024"]) as server:
        yield server


def make_judge(model_dir, server, **kw) -> JudgeReward:
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    settings = {"path": model_dir, "rubric": RUBRIC, "yes": ["y"], "no": ["n"], "top_logprobs": vocab, **kw}
    return JudgeReward(JudgeConfig(**settings), [server.address])


def score_all(judge, completions, record=RECORD):
    async def run():
        return await asyncio.gather(*(judge.ascore("p", c, **record) for c in completions), return_exceptions=True)

    return asyncio.run(run())


def reference_score(model_dir, judge, completion) -> float:
    """P(y) / (P(y) + P(n)) of the judge model's next token, by a plain transformers forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = tokenizer.encode(judge.render("p", completion, RECORD), add_special_tokens=False)
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1)
    text = [tokenizer.decode([i]).strip().lower() for i in range(len(tokenizer))]
    p_yes = sum(probs[i].item() for i, t in enumerate(text) if t == "y")
    p_no = sum(probs[i].item() for i, t in enumerate(text) if t == "n")
    return p_yes / (p_yes + p_no)


def test_logprob_verdict_is_the_judge_models_probability_and_batched(tiny_model_dir, judge_server):
    judge = make_judge(tiny_model_dir, judge_server, max_wait=0.5)
    scores = score_all(judge, COMPLETIONS)
    assert judge.stats["judge_batches"] == 1  # six concurrent samples, one request
    for completion, score in zip(COMPLETIONS, scores):
        assert math.isclose(score, reference_score(tiny_model_dir, judge, completion), rel_tol=1e-3), completion
    assert len({round(s, 6) for s in scores}) > 1  # the verdict depends on the completion


def test_batches_are_capped_and_give_the_same_scores(tiny_model_dir, judge_server):
    judge = make_judge(tiny_model_dir, judge_server, max_batch_size=4, max_wait=0.5)
    batched = score_all(judge, COMPLETIONS * 2)
    assert judge.stats["judge_batches"] == 3  # 12 samples, at most 4 a request
    alone = [make_judge(tiny_model_dir, judge_server)("p", c, **RECORD) for c in COMPLETIONS]
    for got, want in zip(batched, alone * 2):
        assert math.isclose(got, want, rel_tol=1e-4)


def test_unreadable_verdict_is_a_counted_failure(tiny_model_dir, judge_server):
    """A random model's greedy reply holds no verdict: each sample fails, none scores 0."""
    judge = make_judge(
        tiny_model_dir, judge_server, verdict="text", max_new_tokens=4, yes=["affirmative"], no=["negative"]
    )
    stats: dict[str, int] = {}
    scorer = Scorer(judge, RewardPool(max_workers=1), "reject", stats)

    async def run():
        return await asyncio.gather(*(scorer.score("p", c, [1], [2], RECORD) for c in COMPLETIONS[:3]))

    assert asyncio.run(run()) == [None, None, None]  # rejected, not zero
    assert stats["reward_errors"] == 3 and stats["reward_timeouts"] == 0
    assert judge.stats["judge_unparseable"] == 3
    with pytest.raises(VerdictError, match="has no verdict"):
        judge("p", "7", **RECORD)


def test_a_judge_that_does_not_answer_in_time_fails_every_sample_of_the_batch(tiny_model_dir, judge_server):
    judge = make_judge(tiny_model_dir, judge_server, timeout=1.0, max_wait=0.2)
    stats: dict[str, int] = {}
    scorer = Scorer(judge, RewardPool(max_workers=1), "reject", stats)
    assert judge_server.post("/pause_generation", {"mode": "abort"})[0] == 200  # requests now wait at the gate
    try:

        async def run():
            return await asyncio.gather(*(scorer.score("p", c, [1], [2], RECORD) for c in COMPLETIONS[:4]))

        assert asyncio.run(run()) == [None] * 4
        with pytest.raises(RewardTimeout, match="longer than 1.0s"):
            judge("p", "7", **RECORD)
    finally:
        assert judge_server.post("/continue_generation", {})[0] == 200
    assert stats["reward_timeouts"] == 4 and stats["reward_errors"] == 0
    assert 0.0 <= judge("p", "7", **RECORD) <= 1.0  # the server answers again


def test_unreachable_judge_and_missing_rubric_field_are_reward_errors(tiny_model_dir, judge_server):
    dead = JudgeReward(JudgeConfig(path=tiny_model_dir, rubric=RUBRIC), [f"127.0.0.1:{free_ports(1)[0]}"])
    with pytest.raises(RewardError, match="unreachable"):
        dead("p", "7", **RECORD)
    judge = make_judge(tiny_model_dir, judge_server, rubric="Reference: {reference}\n{completion}")
    with pytest.raises(RewardError, match=r"names 'reference', which this record lacks"):
        judge("p", "7", **RECORD)


def test_reference_field_and_plain_rubric_render_without_chat_markup(tiny_model_dir, judge_server):
    judge = make_judge(tiny_model_dir, judge_server, rubric="Q {question} A {completion} ref {answer}")
    assert "<|im_start|>user\nQ 3+4= A 8 ref 7<|im_end|>" in judge.render("p", "8", RECORD)
    plain = JudgeReward(JudgeConfig(address="h:1", chat_template=False, rubric="{prompt}|{completion}"))
    assert plain.render("the prompt", "8", {}) == "the prompt|8"


def test_pickled_judge_scores_alike(tiny_model_dir, judge_server):
    judge = make_judge(tiny_model_dir, judge_server)
    copy = pickle.loads(pickle.dumps(judge))
    assert math.isclose(copy("p", "7", **RECORD), judge("p", "7", **RECORD), rel_tol=1e-6)


def test_addresses_come_from_the_config_or_the_launcher(monkeypatch):
    monkeypatch.setenv(JUDGE_ADDRS_ENV, "127.0.0.1:1,127.0.0.1:2")
    assert judge_addresses(JudgeConfig(path="m")) == ["127.0.0.1:1", "127.0.0.1:2"]
    assert judge_addresses(JudgeConfig(path="m", address="http://h:3")) == ["h:3"]
    monkeypatch.delenv(JUDGE_ADDRS_ENV)
    with pytest.raises(ValueError, match="set judge.address=host:port"):
        judge_addresses(JudgeConfig(path="m"))


@pytest.mark.parametrize(
    "settings, message",
    [
        ({}, "set judge.path=DIR"),
        ({"address": "h:1"}, "judge.chat_template=false"),
        ({"path": "m", "verdict": "vibes"}, "judge.verdict='vibes' is not supported"),
        ({"path": "m", "timeout": 0}, "judge.timeout=0 must be > 0"),
        ({"path": "m", "yes": []}, "must each name at least one word"),
    ],
)
def test_judge_config_errors_name_the_fix(settings, message):
    with pytest.raises(ConfigError, match=message):
        JudgeConfig(**settings)


def test_one_reward_per_run():
    with pytest.raises(ConfigError, match="reward_fn and judge are set"):
        GRPOConfig(reward_fn="m:f", judge=JudgeConfig(path="m"))

"""`ClassifierReward`: a scalar reward model (`AutoModelForSequenceClassification`) as a reward.

The model is loaded once per process (`load_classifier` caches it by path, device and dtype)
on `reward_model.device`, never trained. Samples are rendered (`reward_model.template`, else
the tokenizer's chat template over [user: question, assistant: completion]), and concurrent
ones share a forward pass (`arealite.reward.batching`), run in a thread so the event loop
keeps serving rollouts. With one label the reward is the logit (a Bradley-Terry score, as
TRL's and OpenRLHF's reward models give); with several it is the softmax probability of
`reward_model.positive_label`. A pass that overruns `reward_model.timeout` fails each of its
samples with RewardTimeout.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from arealite.config import RewardModelConfig
from arealite.reward.batching import MicroBatcher, per_loop
from arealite.reward.judge import question_of
from arealite.reward.pool import RewardError

_MODELS: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_LOAD_LOCK = threading.Lock()


def resolve_device(device: str) -> str:
    """`auto` -> cuda when available, else cpu; anything else as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_classifier(path: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) of `path`, loaded once per process and kept in eval mode."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    key = (path, resolve_device(device), dtype)
    with _LOAD_LOCK:
        if key not in _MODELS:
            tokenizer = AutoTokenizer.from_pretrained(path)
            tokenizer.truncation_side = "left"  # a long input keeps its end: the completion being scored
            model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=getattr(torch, dtype))
            if model.config.pad_token_id is None:  # a classifier reads the last non-pad token
                model.config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
            _MODELS[key] = (model.to(key[1]).eval(), tokenizer)
        return _MODELS[key]


class ClassifierReward:
    """Scores completions with a sequence-classification model (module docstring). Picklable."""

    def __init__(self, config: RewardModelConfig) -> None:
        self.config = config
        self._batchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._forward_lock = threading.Lock()  # one forward at a time: the batches already fill the model

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"])

    def render(self, prompt: str, completion: str, data: dict[str, Any]) -> str:
        """The classifier's input text for one sample."""
        question = question_of(prompt, data)
        if self.config.template:
            values = {**data, "prompt": prompt, "completion": completion, "question": question}
            try:
                return self.config.template.format_map(values)
            except KeyError as e:
                raise RewardError(
                    f"reward_model.template names {e}, which this record lacks (it has {sorted(values)})"
                ) from None
        _, tokenizer = load_classifier(self.config.path, self.config.device, self.config.dtype)
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": question}, {"role": "assistant", "content": completion}]
            return tokenizer.apply_chat_template(messages, tokenize=False)
        return f"{question} {completion}"

    def score_texts(self, texts: list[str]) -> list[float]:
        """One batched forward pass; a reward per text (blocking)."""
        import torch

        model, tokenizer = load_classifier(self.config.path, self.config.device, self.config.dtype)
        enc = tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.config.max_length
        ).to(model.device)
        with self._forward_lock, torch.no_grad():
            logits = model(**enc).logits.float()  # [B, num_labels]
        if logits.shape[-1] == 1:
            return logits[:, 0].tolist()
        label = self.config.positive_label
        if label >= logits.shape[-1]:
            raise RewardError(
                f"reward_model.positive_label={label}, but the model has {logits.shape[-1]} labels; pick one of them"
            )
        return logits.softmax(-1)[:, label].tolist()

    async def _forward(self, texts: list[str]) -> list[float]:
        return await asyncio.to_thread(self.score_texts, texts)

    async def ascore(
        self, prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, **data: Any
    ) -> float:
        """The reward model's score of one completion; RewardError / RewardTimeout when it has none."""
        text = self.render(prompt, completion, data)
        c = self.config
        batcher = per_loop(
            self._batchers,
            lambda: MicroBatcher(self._forward, c.max_batch_size, c.max_wait, 1, c.timeout, "reward model"),
        )
        return await batcher.submit(text)

    def __call__(self, prompt: str, completion: str, prompt_ids: Any = None, completion_ids: Any = None, **data: Any):
        """Blocking `ascore`: the plain reward-function signature."""
        return asyncio.run(self.ascore(prompt, completion, prompt_ids, completion_ids, **data))

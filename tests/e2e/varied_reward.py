"""A reward with variance inside every group even for a random model, so GRPO's
group-normalized advantages are non-zero and an update must move the weights."""


def even_token_fraction(prompt, completion, prompt_ids, completion_ids, **_):
    ids = list(completion_ids)
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)

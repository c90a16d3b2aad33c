"""A reward with variance inside every group even for a random model, so GRPO's
group-normalized advantages are non-zero and an update must move the weights."""


def even_token_fraction(prompt, completion, prompt_ids, completion_ids, **_):
    ids = list(completion_ids)
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


def constant_for_even_answers(prompt, completion, prompt_ids, completion_ids, answer="", **_):
    """1 for every sample of a prompt with an even answer (a group with no learning signal),
    the even-token fraction otherwise; for the dynamic-sampling test."""
    if int(answer) % 2 == 0:
        return 1.0
    return even_token_fraction(prompt, completion, prompt_ids, completion_ids)


def constant(prompt, completion, prompt_ids, completion_ids, **_):
    """The same reward for every sample: no group has signal (dynamic sampling's bound)."""
    return 1.0

"""Module-level reward functions for the agent tests (they run in worker processes)."""


def exact_answer(prompt, completion, prompt_ids, completion_ids, answer="", **_):
    return float(completion.strip() == str(answer))

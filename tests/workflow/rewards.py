"""Reward functions for workflow tests. Module-level, so worker processes can import them."""

import time


def wrong_until_feedback(prompt, completion, prompt_ids, completion_ids, **data):
    """0 on the first answer, 1 once the context holds the feedback turn."""
    return 1.0 if data["feedback_marker"] in prompt else 0.0


def always_raises(prompt, completion, prompt_ids, completion_ids, **data):
    raise RuntimeError("reward checker crashed")


def hangs(prompt, completion, prompt_ids, completion_ids, **data):
    time.sleep(60)
    return 1.0


def completion_length(prompt, completion, prompt_ids, completion_ids, **data):
    return float(len(completion_ids))


def reports_truncation(prompt, completion, prompt_ids, completion_ids, truncated, **data):
    """1 for a truncated response, else 0: echoes what the workflow passed."""
    return float(truncated)

"""`Scheduler.num_requests` (what /flush_cache and weight updates check) never counts a request
that has already been answered, even in the moment before the scheduler drops it."""

import threading

from transformers import AutoTokenizer

from arealite.server.model_runner import ModelRunner
from arealite.server.request import Req
from arealite.server.sampling import SamplingParams
from arealite.server.scheduler import Scheduler, SchedulerLimits


def test_answered_requests_do_not_count(tiny_model_dir):
    runner = ModelRunner(tiny_model_dir)
    scheduler = Scheduler(runner, AutoTokenizer.from_pretrained(tiny_model_dir), set(), SchedulerLimits(), "0")
    seen: dict[str, list[int]] = {"running": [], "answered": []}
    done = threading.Event()

    def on_event(req: Req, n: int, finished: bool) -> None:  # runs on the scheduler thread
        seen["answered" if finished else "running"].append(scheduler.num_requests)
        if finished:
            done.set()

    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    req = Req("r0", [5, 6, 7], params, 3, stream=True, on_event=on_event)
    scheduler.start()
    try:
        scheduler.submit(req)
        assert done.wait(30)
    finally:
        scheduler.stop()
    assert seen["running"][-1] == 1  # counted while decoding (its first token comes during admission)
    assert seen["answered"] == [0]  # answered, still in the running list, not counted
    assert scheduler.num_requests == 0

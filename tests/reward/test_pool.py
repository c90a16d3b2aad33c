"""The reward process pool: results, raised errors and timeouts are distinguished, never zeroed."""

import time

import pytest

from arealite.reward.math import gsm8k_reward_fn
from arealite.reward.pool import RewardError, RewardPool, RewardTimeout, check_picklable


@pytest.fixture(scope="module")
def pool():
    p = RewardPool(max_workers=1, timeout=20.0)
    yield p
    p.close()


@pytest.mark.timeout(120)
def test_scores_in_a_worker_process(pool):
    assert pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="7") == 1.0
    assert pool.score(gsm8k_reward_fn, "p", "#### 8", [1], [2], answer="7") == 0.0


@pytest.mark.timeout(120)
def test_raising_reward_is_a_reward_error(pool):
    with pytest.raises(RewardError, match="empty reference answer"):
        pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="")


@pytest.mark.timeout(120)
def test_hung_reward_times_out_and_pool_recovers():
    pool = RewardPool(max_workers=1, timeout=1.0)
    try:
        pool.score(gsm8k_reward_fn, "p", "#### 1", None, None, answer="1")  # start the worker
        with pytest.raises(RewardTimeout, match="longer than 1.0s"):
            pool.score(time.sleep, 30)
        # the stuck worker was killed; a fresh pool answers
        assert pool.score(gsm8k_reward_fn, "p", "#### 2", None, None, answer="2") == 1.0
    finally:
        pool.close()


def test_unpicklable_reward_fails_early():
    with pytest.raises(TypeError, match="define it at module level"):
        check_picklable(lambda *a, **k: 1.0)


@pytest.mark.timeout(120)
def test_unpicklable_reward_through_the_pool_is_a_reward_error(pool):
    with pytest.raises(RewardError, match="[Cc]an.t pickle"):
        pool.score(lambda *a, **k: 1.0)


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="max_workers=0"):
        RewardPool(max_workers=0)
    with pytest.raises(ValueError, match="timeout=0"):
        RewardPool(timeout=0)


# A training script with a reward of its own: its top level records each process that runs it.
SCRIPT = """
import json, os
with open(os.path.join(os.environ["RUNS_DIR"], f"{os.getpid()}.json"), "w") as f:
    json.dump({"as": __name__}, f)
from arealite.reward.math import gsm8k_reward_fn
from arealite.reward.pool import RewardPool

def scripts_reward(prompt, completion, *args, **kwargs):
    return 0.25

if __name__ == "__main__":
    with RewardPool(max_workers=2, timeout=60) as pool:
        steps = [(pool.score(gsm8k_reward_fn, "p", "#### 7", [1], [2], answer="7"), pool.with_main)]
        steps.append((pool.score(scripts_reward, "p", "c"), pool.with_main))
        steps.append((pool.score(gsm8k_reward_fn, "p", "#### 8", [1], [2], answer="7"), pool.with_main))
    print(json.dumps(steps), flush=True)
"""


@pytest.mark.timeout(120)
def test_workers_import_the_main_module_only_for_a_reward_defined_there(tmp_path):
    """A reward from an importable module is scored by workers that never ran the training
    script's top level (its imports: torch, transformers); the first reward defined in the
    script moves the pool to workers that did, and it scores there."""
    import json
    import subprocess
    import sys

    from arealite.launcher.process import with_package_path

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    runs_dir = tmp_path / "runs"  # a file per process that ran the script's top level
    runs_dir.mkdir()
    env = dict(with_package_path(None), OMP_NUM_THREADS="1", RUNS_DIR=str(runs_dir))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[1.0, False], [0.25, True], [0.0, True]]
    runs = sorted(json.loads(path.read_text())["as"] for path in runs_dir.iterdir())
    # the script itself, then only the two workers started for its own reward (not the first two)
    assert runs == ["__main__", "__mp_main__", "__mp_main__"], runs

"""`with PPOActor(...)`: the model, optimizer and (when the engine started it) the default
process group are released on exit, errors included; a group the caller started stays up.

Runs in a fresh interpreter: whether a process group exists is process-wide state."""

import json
import subprocess
import sys
import textwrap

import pytest

from arealite.launcher.process import with_package_path

pytestmark = pytest.mark.timeout(180)

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from arealite.config import PPOActorConfig
    from arealite.world import init_distributed
    from arealite.train import PPOActor

    config = PPOActorConfig(path=sys.argv[1])
    out = {}
    try:
        with PPOActor(config) as actor:
            out["inside"] = dist.is_initialized() and actor.model is not None
            raise RuntimeError("a failing cell")
    except RuntimeError:
        pass
    out["after_error"] = {"group": dist.is_initialized(), "model": actor._model is not None}
    with PPOActor(config) as outer:
        with PPOActor(config) as inner:  # e.g. a reference model beside the actor
            pass
        out["after_inner"] = dist.is_initialized()  # the outer engine still needs the group
    out["after_outer"] = dist.is_initialized()
    init_distributed()  # the caller's own group: engines must leave it up
    with PPOActor(config):
        pass
    out["callers_group"] = dist.is_initialized()
    print("RESULT " + json.dumps(out))
    """
)


def test_actor_with_blocks_release_their_process_group(tiny_model_dir):
    env = dict(with_package_path(None), OMP_NUM_THREADS="1", AREALITE_TRAIN_DEVICE="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_model_dir], env=env, capture_output=True, text=True, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert result == {
        "inside": True,
        "after_error": {"group": False, "model": False},
        "after_inner": True,
        "after_outer": False,
        "callers_group": True,
    }

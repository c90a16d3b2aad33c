"""`WeightSync` against a recording rollout client and a small torch model: the order of the
steps for disk, lora and distributed (the distributed one over a real gloo group that a
thread joins as the server), retention, a version mismatch, validation and close().
The paths against real servers are covered by tests/train/test_server_parity.py,
tests/train/test_lora_sync.py, tests/reliability/test_dead_server_in_broadcast.py and the
end-to-end runs."""

from __future__ import annotations

import concurrent.futures
import os
import threading

import pytest
import torch

from arealite.config import GRPOConfig, load_config
from arealite.rollout.errors import WeightUpdateError
from arealite.weight_sync import WeightSync
from arealite.weight_sync.group import broadcast, init_custom_process_group


class FakeActor:
    """A TrainEngine: a small model on the CPU whose `save` writes a marker file."""

    def __init__(self, lora=None) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
        self.compute_dtype, self.device = torch.float32, torch.device("cpu")
        self.has_lora = lora is not None
        self.version, self.log = 0, []

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "weights"), "w").close()
        self.log.append(("save", os.path.basename(path)))

    def set_version(self, version: int) -> None:
        self.version = version
        self.log.append(("actor.set_version", version))


def _done(result=None) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    future.set_result(result)
    return future


class FakeRollout:
    """The rollout client's weight-sync verbs, recorded in one log shared with the actor.
    Distributed: a thread joins the trainer's group as rank 1 and receives every bucket."""

    def __init__(self, log: list, reported: str | None = None) -> None:
        self.log, self.reported = log, reported
        self.group, self.members, self.received = None, [], {}
        self._pg, self._joined = None, None

    def pause(self):
        self.log.append("pause")

    def resume(self, wait=True):
        self.log.append("resume")

    def set_version(self, version):
        self.log.append(("rollout.set_version", version))

    def set_lora_adapter(self, name):
        self.log.append(("set_lora_adapter", name))

    def update_weights(self, meta):
        self.log.append(("update", meta.type, meta.version))
        if meta.type != "distributed":
            return _done()
        return concurrent.futures.ThreadPoolExecutor(1).submit(self._receive, meta)

    def _receive(self, meta):
        self._joined.join()
        for bucket in meta.buckets:
            for name, dtype, shape in bucket:
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                broadcast(self._pg, t, src=0)
                self.received[name] = t

    def confirm_version(self, version):
        self.log.append(("confirm", version))
        got = self.reported or str(version)
        if got != str(version):
            raise WeightUpdateError(f"after the weight sync to version {version}, servers report other versions")
        return {"fake:1": got}

    def weight_group_candidates(self):
        return ["fake:1"]

    def current_weight_group(self):
        return self.group, list(self.members)

    def init_weights_update_group(self, meta, members=None):
        self.log.append("init_group")
        self.group, self.members = meta, list(members)

        def join():
            self._pg = init_custom_process_group(
                "gloo", meta.master_address, meta.master_port, 1, 2, meta.group_name, timeout=30
            )

        self._joined = threading.Thread(target=join)
        self._joined.start()
        return _done()

    def leave_weights_update_group(self):
        self.log.append("leave_group")
        self.group, self.members = None, []

    def exclude_dead(self, addresses):
        return []


def test_disk_sync_order_and_retention(tmp_path):
    actor = FakeActor()
    rollout = FakeRollout(actor.log)
    with WeightSync(actor, rollout, "disk", str(tmp_path), keep_versions=2) as weight_sync:
        for version in (1, 2, 3):
            assert weight_sync.sync(version) == {"fake:1": str(version)}
    assert actor.log[-7:] == [
        ("save", "v3"), "pause", ("update", "disk", 3), ("confirm", 3),
        ("rollout.set_version", 3), ("actor.set_version", 3), "resume",
    ]  # fmt: skip
    assert sorted(os.listdir(tmp_path / "weights")) == ["v2", "v3"]
    assert weight_sync.meta(3).path == str(tmp_path / "weights" / "v3")


def test_lora_sync_switches_the_adapter_before_resuming(tmp_path):
    actor = FakeActor(lora=object())
    rollout = FakeRollout(actor.log)
    WeightSync(actor, rollout, "lora", str(tmp_path)).sync(4)
    assert actor.log == [
        ("save", "v4"), "pause", ("update", "lora", 4), ("confirm", 4),
        ("set_lora_adapter", "arealite-lora-v4"), ("rollout.set_version", 4), ("actor.set_version", 4), "resume",
    ]  # fmt: skip


def test_a_version_mismatch_raises_before_anyone_moves_on(tmp_path):
    actor = FakeActor()
    rollout = FakeRollout(actor.log, reported="1")
    with pytest.raises(WeightUpdateError, match="version 2"):
        WeightSync(actor, rollout, "disk", str(tmp_path)).sync(2)
    assert ("rollout.set_version", 2) not in actor.log and "resume" not in actor.log


def test_distributed_sync_broadcasts_every_parameter_over_a_real_group(tmp_path):
    actor = FakeActor()
    rollout = FakeRollout(actor.log)
    with WeightSync(actor, rollout, "distributed", backend="gloo", chunk_mb=1, timeout=30) as weight_sync:
        assert rollout.log == ["init_group"]  # the group forms once, at construction
        with torch.no_grad():
            actor.model[0].weight.mul_(2.0)
        weight_sync.sync(1)
        assert actor.log[1:] == [
            "pause", ("update", "distributed", 1), ("confirm", 1),
            ("rollout.set_version", 1), ("actor.set_version", 1), "resume",
        ]  # fmt: skip
        sent = dict(actor.model.named_parameters())
        assert rollout.received.keys() == sent.keys()
        for name, t in rollout.received.items():
            assert torch.equal(t, sent[name].detach()), name
        group = rollout.group.group_name
        assert weight_sync._groups.get(group) is not None
    assert weight_sync._groups.get(group) is None  # close() dropped rank 0's end


@pytest.mark.parametrize("mode", ["disk", "distributed"])
def test_from_config_reads_the_experiment_settings(tmp_path, mode):
    overrides = [f"fileroot={tmp_path}", f"weight_update={mode}", "weight_keep_versions=2"]
    config = load_config([*overrides, "rollout.weight_update_timeout=7"], GRPOConfig)
    actor = FakeActor()
    rollout = FakeRollout(actor.log)
    with WeightSync.from_config(config, actor, rollout) as weight_sync:
        meta = weight_sync.meta(3)
        if mode == "disk":
            assert meta.path == os.path.abspath(os.path.join(config.run_dir, "weights", "v3"))
            assert meta.keep_versions == 2
        else:  # the group the servers joined, and each broadcast, wait rollout.weight_update_timeout
            assert rollout.group.timeout == meta.timeout == 7
            rollout._joined.join()


def test_bad_settings_name_the_fix(tmp_path):
    actor, rollout = FakeActor(), FakeRollout([])
    with pytest.raises(ValueError, match="weight_update='nfs'.*'disk', 'distributed' or 'lora'"):
        WeightSync(actor, rollout, "nfs", str(tmp_path))
    with pytest.raises(ValueError, match="keep_versions=0 must be >= 1"):
        WeightSync(actor, rollout, "disk", str(tmp_path), keep_versions=0)
    with pytest.raises(ValueError, match="weight_update=lora exactly when actor.lora is set"):
        WeightSync(actor, rollout, "lora", str(tmp_path))
    with pytest.raises(ValueError, match="needs run_dir"):
        WeightSync(actor, rollout, "disk")

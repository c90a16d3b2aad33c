"""The distributed weight sync: a broadcast group that survives a server dying in it.

Trainer rank 0 and the servers form a torch.distributed group and rank 0 broadcasts the
buckets. When a member dies, rank 0 drops its end of the group (the survivors' receives fail at
once), takes the dead out of rotation and broadcasts every bucket again to a fresh group of the
rest. A kept group is rebuilt when membership changes. Every trainer rank runs
`broadcast_weights`; only rank 0 talks to the servers, through a `WeightSyncTarget`
(docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable

import torch
import torch.distributed as dist

from arealite import world
from arealite.interfaces import WeightSyncTarget
from arealite.types import WeightUpdateMeta
from arealite.utils import net
from arealite.weight_sync.group import WeightBroadcastError, init_custom_process_group, release_store

logger = logging.getLogger(__name__)
_DONE, _RETRY, _FAIL = 0, 1, 2


class WeightSyncError(RuntimeError):
    """The distributed weight sync could not reach a consistent state on any server."""


class Groups:
    """Trainer rank 0's end of the weight-update groups, by name (rank 0 hosts each store)."""

    def __init__(self) -> None:
        self._groups: dict[str, dist.ProcessGroup] = {}

    def join(self, meta: WeightUpdateMeta, world_size: int) -> None:
        """Join `meta`'s group as its rank 0; blocks until every server has joined, so their
        `/init_weights_update_group` calls must be in flight concurrently."""
        self._groups[meta.group_name] = init_custom_process_group(
            meta.backend, meta.master_address, meta.master_port, 0, world_size, meta.group_name, meta.timeout
        )

    def get(self, name: str) -> dist.ProcessGroup | None:
        return self._groups.get(name)

    def destroy(self, name: str) -> None:
        """Drop a group. Its connections close with it, so servers still waiting on it fail
        at once instead of at their timeout."""
        self._groups.pop(name, None)
        release_store(name)

    def close(self) -> None:
        for name in list(self._groups):
            self.destroy(name)


def _abandon(groups: Groups, rollout: WeightSyncTarget, meta: WeightUpdateMeta) -> None:
    groups.destroy(meta.group_name)
    rollout.leave_weights_update_group()


def ensure_group(groups: Groups, rollout: WeightSyncTarget, meta: WeightUpdateMeta) -> WeightUpdateMeta:
    """Rank 0: `meta` with the group of the servers now alive, building one if needed.

    A server that fails to join (dead, or the rendezvous timed out) is excluded and the
    group is built again without it; raises WeightSyncError when no server is left or a
    join failed with every server alive.
    """
    while True:
        members = rollout.weight_group_candidates()
        current, current_members = rollout.current_weight_group()
        if current is not None and members == current_members:
            return dataclasses.replace(meta, group_name=current.group_name, master_port=current.master_port)
        if current is not None:
            _abandon(groups, rollout, current)
        if not members:
            raise WeightSyncError("no inference server answers /health; none can receive the weights")
        base = meta.group_name.split("#")[0]
        new = dataclasses.replace(
            meta, group_name=f"{base}#{uuid.uuid4().hex[:8]}", master_port=net.free_ports(1, "")[0]
        )
        joined = rollout.init_weights_update_group(new, members)  # the servers block until rank 0 joins
        try:
            groups.join(new, 1 + len(members))
            joined.result()
            logger.info("weight-update group %s formed with %s", new.group_name, members)
            return new
        except Exception as e:
            error = e
        joined.exception()  # wait for the servers' side (bounded by their timeout) before retrying
        _abandon(groups, rollout, new)
        if not rollout.exclude_dead(members):
            raise WeightSyncError(
                f"the weight-update group could not be formed, though every server is alive: {error}"
            ) from error
        logger.warning(
            "weight-update group %s failed to form (%s); retrying without the dead servers", new.group_name, error
        )


def _settle(
    groups: Groups, rollout: WeightSyncTarget, meta: WeightUpdateMeta, future, broadcast_error: Exception | None,
    fresh: bool,
) -> tuple[int, str]:  # fmt: skip
    """Rank 0, after one attempt: wait for the servers' calls, exclude the dead, decide.

    `fresh`: the group was built for this attempt. A kept group can fail with every server
    alive (a server restarted between syncs faster than the health probes noticed is not in
    it); that is worth one more try with a new group, a fresh group failing so is not.
    """
    members = rollout.current_weight_group()[1]
    dead = []
    if broadcast_error is not None:  # find the culprit at once: its pending call is then abandoned
        dead = rollout.exclude_dead(members)
    try:
        future.result()
        update_error = None
    except Exception as e:
        update_error = e
    if broadcast_error is None and update_error is None:
        return _DONE, ""
    _abandon(groups, rollout, meta)  # a group with a failed member is unusable
    dead += rollout.exclude_dead([m for m in members if m not in dead])
    failed = set(getattr(update_error, "failed", {}) or members) if update_error is not None else set()
    errors = "; ".join(str(e) for e in (broadcast_error, update_error) if e is not None)
    if dead:
        logger.warning("servers %s died during the weight update (%s); continuing on the others", dead, errors)
    if broadcast_error is None and failed <= set(dead) and set(members) - set(dead):
        return _DONE, ""  # every live member received every bucket
    if (dead or not fresh) and set(members) - set(dead):
        return _RETRY, errors
    reason = "no server survived it" if dead else "every server is alive and a fresh group failed too"
    return _FAIL, f"the distributed weight update failed and {reason}: {errors}"


def broadcast_weights(
    groups: Groups, rollout: WeightSyncTarget, meta: WeightUpdateMeta, upload: Callable[[WeightUpdateMeta], None]
) -> None:
    """Push the actor's weights to every live server by broadcast; collective over trainer ranks.

    `upload(meta)` gathers on every rank and broadcasts from rank 0 over `meta.group_name`;
    it raises WeightBroadcastError on rank 0 when a broadcast failed.

    Retries without the servers that died until the live ones all hold every bucket. Raises
    WeightSyncError (on every rank) when that cannot be reached.
    """
    rank = world.rank()
    while True:
        future, failure = None, None
        if rank == 0:
            try:
                kept = rollout.current_weight_group()[0]
                meta = ensure_group(groups, rollout, meta)
                fresh = kept is None or kept.group_name != meta.group_name
                future = rollout.update_weights(meta)
            except Exception as e:
                failure = e
                meta = dataclasses.replace(meta, group_name="")  # no group: rank 0 only gathers
        try:
            upload(meta)  # gathers on every rank; rank 0 broadcasts while the servers receive
        except WeightBroadcastError as e:
            failure = failure or e
        status, message = _DONE, ""
        if rank == 0:
            if future is None:
                status, message = _FAIL, str(failure)
            else:
                status, message = _settle(groups, rollout, meta, future, failure, fresh)
        flag = world.all_reduce(torch.tensor([status]), "max")  # rank 0 decides for everyone
        status = int(flag.item())
        if status == _DONE:
            return
        if status == _FAIL:
            raise WeightSyncError(
                message if rank == 0 else "the distributed weight update failed on trainer rank 0; see its log"
            )
        logger.warning("retrying the weight broadcast on the remaining servers: %s", message)

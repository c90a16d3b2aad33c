"""The server side of a weight sync: the HTTP calls that load new weights on every server.

disk (docs/protocol.md §3.2), distributed (§3.3-3.4: one call per bucket while the trainer's
rank 0 broadcasts it) and lora (load the new adapter, set the version, unload the old one).
Every update carries `weight_version`; what else the body holds follows the engine's
`pause_mode` (docs/protocol.md §3.1, §3.9; adapters: docs/lora.md). A server out of
rotation is skipped and brought up to date when it rejoins; in a distributed group the live
members keep being fed when one fails (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from arealite.backends.contract import Backend, Call, error_message
from arealite.backends.sglang import SGLangProtocol
from arealite.config import InferenceEngineConfig
from arealite.rollout.errors import TransientServerError, WeightUpdateError
from arealite.rollout.health import HealthMonitor
from arealite.rollout.servers import ServerPool
from arealite.rollout.transport import Transport
from arealite.types import WeightUpdateMeta

logger = logging.getLogger(__name__)
_DIST_SETTING = "rollout.weight_update_timeout"
_SERVER_GRACE_S = 5.0  # the client waits this much longer than the server, so the server's own error arrives


class WeightUpdater:
    """Sends weight-update calls to the pool's servers; remembers what a rejoining server missed.

    `health` answers liveness (`alive`) and puts a server that received the weights it
    missed back into rotation (`bring_back`)."""

    def __init__(
        self,
        transport: Transport,
        pool: ServerPool,
        config: InferenceEngineConfig,
        health: HealthMonitor,
        server_protocol: Backend | None = None,
    ) -> None:
        self._protocol = server_protocol or SGLangProtocol()
        self._transport = transport
        self._pool = pool
        self._config = config
        self._health = health
        self._last_disk: WeightUpdateMeta | None = None
        self._last_distributed: WeightUpdateMeta | None = None
        self._last_lora: WeightUpdateMeta | None = None
        self.adapters: dict[str, str] = {}  # server -> the LoRA adapter name this client last loaded there
        self.group: WeightUpdateMeta | None = None  # the distributed group the servers joined
        self.members: list[str] = []  # its servers, rank 1 + i
        self.awaiting: set[str] = set()  # back after a broadcast they missed; in the next group
        self._pending: set[asyncio.Future] = set()  # fire-and-forget destroy calls
        self._updating = asyncio.Lock()  # an update in flight, or a rejoin; never both (arejoin)

    async def _post(
        self, address: str, path: str, body: dict[str, Any] | None, timeout: float | None = None, setting: str = ""
    ) -> None:
        if timeout is None:
            timeout, setting = self._config.request_timeout, "rollout.request_timeout"
        try:
            status, reply = await self._transport.request("POST", address, path, body, timeout, setting=setting)
        except TransientServerError as e:
            raise WeightUpdateError(f"POST {path} failed: {e}", address) from e
        if status != 200 or (isinstance(reply, dict) and reply.get("success") is False):
            raise WeightUpdateError(f"POST {path} returned {status}: {error_message(reply)}", address)

    async def _post_each(self, addresses: list[str], path: str, bodies: list[Any], post=None) -> None:
        """POST concurrently (through `post(address, path, body)`, default one call); a server
        that went down is taken out of rotation (it is re-synced when it rejoins), any other
        failure is raised. Fails if no server took the update."""
        post = post or self._post
        calls = (self._pool.unless_left(a, post(a, path, b)) for a, b in zip(addresses, bodies))
        results = await asyncio.gather(*calls, return_exceptions=True)
        done = 0
        for address, result in zip(addresses, results):
            if not self._pool.is_healthy(address):  # taken out meanwhile (the call was abandoned)
                continue
            if isinstance(result, BaseException):
                dead = isinstance(result.__cause__, TransientServerError) and not await self._health.alive(address)
                if dead:
                    self._pool.take_out(address, f"it died during {path}; it gets the weights when back")
                    continue
                raise result
            done += 1
        if addresses and done == 0:
            raise WeightUpdateError(f"POST {path} reached no server (all of {addresses} are down)")

    @property
    def _keeps_requests(self) -> bool:
        """Whether paused servers hold on to their requests (pause_mode in_place / retract)."""
        return self._config.pause_mode != "abort"

    @property
    def _dist_timeout(self) -> float:
        return self._config.weight_update_timeout + _SERVER_GRACE_S

    async def _disk_update(self, address: str, path: str, meta: WeightUpdateMeta, paused: bool = True) -> None:
        """Load `meta.path` on one server, in as many calls as its protocol takes (`path` unused:
        the protocol names them)."""
        calls = self._protocol.disk_update_calls(meta.path or "", meta.version, self._keeps_requests, paused)
        for call_path, body in calls:
            await self._post(address, call_path, body)

    async def aupdate(self, meta: WeightUpdateMeta) -> None:
        async with self._updating:
            await self._update(meta)

    async def _update(self, meta: WeightUpdateMeta) -> None:
        refusal = self._protocol.unsupported(meta.type)
        if refusal is not None:
            raise WeightUpdateError(refusal)
        if meta.type == "disk":
            if not meta.path:
                raise WeightUpdateError("WeightUpdateMeta(type='disk') needs path= the folder holding the new weights")
            addresses = self._pool.healthy
            first = self._protocol.disk_update_calls(meta.path, meta.version, self._keeps_requests, True)[0][0]
            await self._post_each(addresses, first, [meta] * len(addresses), self._disk_update)
            self._last_disk = meta
        elif meta.type == "distributed":
            if not meta.buckets:
                raise WeightUpdateError(
                    "WeightUpdateMeta(type='distributed') has no buckets; the trainer must fill meta.buckets "
                    "with the (name, dtype, shape) lists it broadcasts, in broadcast order"
                )
            await self._broadcast_calls(meta)
            self._last_distributed = meta
        elif meta.type == "lora":
            if not meta.path or not meta.lora_name:
                raise WeightUpdateError("WeightUpdateMeta(type='lora') needs path= the adapter folder and lora_name=")
            addresses = self._pool.healthy
            await self._post_each(addresses, "/load_lora_adapter", [meta] * len(addresses), self._load_adapter)
            self._last_lora = meta
        else:
            raise WeightUpdateError(
                f"WeightUpdateMeta.type={meta.type!r} is not supported; use 'disk', 'distributed' or 'lora'"
            )

    async def _load_adapter(self, address: str, path: str, meta: WeightUpdateMeta) -> None:
        """Load `meta`'s adapter on one server, set its version, unload the one it replaces."""
        body = {"lora_name": meta.lora_name, "lora_path": meta.path}
        try:
            await self._post(address, path, body)
        except WeightUpdateError as e:
            if "already loaded" not in str(e):
                raise
            await self._post(address, "/unload_lora_adapter", {"lora_name": meta.lora_name})
            await self._post(address, path, body)
        # SGLang aborts every request on a version change unless told otherwise; none run while paused
        await self._post(
            address, "/update_weight_version", {"new_version": str(meta.version), "abort_all_requests": False}
        )
        old, self.adapters[address] = self.adapters.get(address), meta.lora_name
        if old is not None and old != meta.lora_name:
            try:  # best effort: an adapter left behind costs memory, not correctness
                await self._post(
                    address,
                    "/unload_lora_adapter",
                    {"lora_name": old},
                    self._config.control_timeout,
                    "rollout.control_timeout",
                )
            except WeightUpdateError as e:
                logger.warning("could not unload the replaced LoRA adapter %s from %s: %s", old, address, e)

    async def _broadcast_calls(self, meta: WeightUpdateMeta) -> None:
        """Each member of the group gets its protocol's calls (`distributed_calls`): the ones
        before, then one per bucket, all members at once, bucket by bucket, then the ones after.
        A member whose call fails gets no more; the others keep receiving, so only the failed one
        can hold up the trainer's broadcast. Raises WeightUpdateError naming every failed member."""
        in_group = self.group is not None and self.group.group_name == meta.group_name
        live = list(self.members if in_group else self._pool.healthy)
        failed: dict[str, str] = {}
        # a member out of rotation (back after a failure, awaiting these weights) was not paused with the rest
        keep = self._keeps_requests
        plans = {a: self._protocol.distributed_calls(meta, keep, self._pool.is_healthy(a)) for a in live}

        async def phase(calls: dict[str, list[Call]]) -> None:
            results = await asyncio.gather(*(self._post_in_order(a, calls[a]) for a in live), return_exceptions=True)
            for address, result in zip(list(live), results):
                if isinstance(result, BaseException):
                    failed[address] = str(result)
                    live.remove(address)

        await phase({a: plan.before for a, plan in plans.items()})
        for i in range(len(meta.buckets)):
            await phase({a: plan.buckets[i : i + 1] for a, plan in plans.items()})
        await phase({a: plan.after for a, plan in plans.items()})
        if failed:
            errors = "; ".join(failed.values())
            error = WeightUpdateError(f"the distributed update failed on {sorted(failed)}: {errors}")
            error.failed = failed  # type: ignore[attr-defined]
            raise error
        for address in sorted(self.awaiting & set(self.members if in_group else ())):
            self.awaiting.discard(address)
            await self._health.bring_back(address)

    async def _post_in_order(self, address: str, calls: list[Call]) -> None:
        for path, body in calls:
            await self._post_member(address, path, body)

    async def _post_member(self, address: str, path: str, body: dict[str, Any]) -> None:
        """One bucket call, abandoned if the server is taken out of rotation meanwhile (a hung
        server would otherwise hold it until its timeout)."""
        if not self._pool.is_healthy(address):  # awaiting weights: out of rotation by design
            return await self._post(address, path, body, self._dist_timeout, _DIST_SETTING)

        async def posted() -> bool:
            await self._post(address, path, body, self._dist_timeout, _DIST_SETTING)
            return True

        if await self._pool.unless_left(address, posted()) is None:
            raise WeightUpdateError(f"POST {path} abandoned: the server left the rotation", address)

    async def ainit_group(self, meta: WeightUpdateMeta, members: list[str] | None = None) -> None:
        """Have server i of `members` (default: all) join the trainer's group as rank 1 + i."""
        if meta.backend not in ("gloo", "nccl"):
            raise WeightUpdateError(f"WeightUpdateMeta.backend={meta.backend!r} is not supported; use 'gloo' or 'nccl'")
        addresses = list(self._pool.addresses if members is None else members)
        # the trainer's rank 0 is the broadcast source; server i joins as rank 1 + i
        calls = [self._protocol.group_join_call(meta, 1 + i, 1 + len(addresses)) for i in range(len(addresses))]
        self.group, self.members = meta, addresses  # also when a join fails: aleave_group then tells them all
        timeout = meta.timeout + _SERVER_GRACE_S
        joins = (self._post(a, path, body, timeout, _DIST_SETTING) for a, (path, body) in zip(addresses, calls))
        results = await asyncio.gather(*joins, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0] if len(errors) == 1 else WeightUpdateError("; ".join(str(e) for e in errors))

    async def aleave_group(self) -> None:
        """Forget the current group and tell its members to destroy it, without waiting: a
        member may be dead or hung, and one whose receive failed has dropped it already."""
        group, members = self.group, self.members
        self.group, self.members = None, []
        if group is None:
            return
        timeout = self._config.health_check_timeout
        path, body = self._protocol.group_leave_call(group.group_name)
        for address in members:
            task = asyncio.ensure_future(self._post(address, path, body, timeout))
            self._pending.add(task)
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future) -> None:
        self._pending.discard(task)
        if not task.cancelled():
            task.exception()  # best effort: a failure here is expected and harmless

    async def acandidates(self) -> list[str]:
        """The servers a new group should hold: those in rotation and those awaiting weights,
        each alive now (in address order, so ranks are stable). Liveness, not /health: the
        servers are paused during a sync, and SGLang's /health blocks while paused."""
        pool = self._pool
        wanted = [a for a in pool.addresses if pool.is_healthy(a) or a in self.awaiting]
        alive = await asyncio.gather(*(self._health.alive(a) for a in wanted))
        return [a for a, ok in zip(wanted, alive) if ok]

    async def aexclude_dead(self, addresses: list[str]) -> list[str]:
        """Check `addresses` are alive; take those that are not out of rotation. Returns them."""
        alive = await asyncio.gather(*(self._health.alive(a) for a in addresses))
        dead = [a for a, ok in zip(addresses, alive) if not ok]
        for address in dead:
            self.awaiting.discard(address)
            self._pool.take_out(
                address,
                "it failed during a distributed weight update; it gets the weights at the next sync after it is back",
            )
        return dead

    async def aconfirm(self, version: int) -> dict[str, str]:
        """Every server in rotation reports `weight_version == version`. One that cannot be
        reached and fails a probe leaves the rotation (re-synced when back); one serving
        another version raises, since it would poison the next batch."""
        addresses = self._pool.healthy

        async def ask(address: str) -> str | None:
            try:
                status, reply = await self._transport.request(
                    "GET", address, self._protocol.version_path, None, self._config.control_timeout,
                    setting="rollout.control_timeout",
                )  # fmt: skip
            except TransientServerError as e:
                if await self._health.alive(address):
                    raise WeightUpdateError(f"the version check failed: {e}", address) from e
                self._pool.take_out(address, f"it died after the weight update to version {version}")
                return None
            return self._protocol.read_version(reply) if status == 200 else f"<HTTP {status}>"

        seen = {a: v for a, v in zip(addresses, await asyncio.gather(*(ask(a) for a in addresses))) if v is not None}
        wrong = {a: v for a, v in seen.items() if v != str(version)}
        if wrong:
            raise WeightUpdateError(
                f"after the weight sync to version {version}, servers report other versions: {wrong}"
            )
        return seen

    async def arejoin(self, address: str) -> bool:
        """Give `address` the weights it missed and put it back into rotation, as one step that
        no weight update interleaves with: a server resynced to the weights an update in flight
        replaces, then brought back, would fail that update's version check. False: not now (an
        update is under way: the next probe retries; or its weights need the next broadcast)."""
        if self._updating.locked():
            return False
        async with self._updating:
            if not await self.aresync(address):
                return False
            await self._health.bring_back(address)
            return True

    async def aresync(self, address: str) -> bool:
        """Give a server that rejoins the rotation the newest weights it missed; False when it
        must wait for the next sync (weights that came by broadcast need the trainer)."""
        last_disk_version = self._last_disk.version if self._last_disk is not None else None
        if self._last_distributed is not None and (
            last_disk_version is None or self._last_distributed.version > last_disk_version
        ):
            if address not in self.awaiting:
                self.awaiting.add(address)
                logger.info(
                    "server %s is back; it rejoins once the next weight sync has broadcast it the weights", address
                )
            return False
        if self._last_lora is not None:  # a run syncs one way only
            await self._load_adapter(address, "/load_lora_adapter", self._last_lora)
        elif self._last_disk is not None:  # the rejoiner was never paused: nothing of ours to keep
            calls = self._protocol.disk_update_calls(self._last_disk.path or "", self._last_disk.version, False, False)
            for call_path, body in calls:
                await self._post(address, call_path, body)
        self.awaiting.discard(address)
        return True

"""arealite's weight-transfer engine for vLLM (`--weight-transfer-config '{"backend": "arealite"}'`).

Runs inside vLLM's environment (imports only what vLLM brings). It makes vLLM's own streaming
routes (`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`) receive the buckets that arealite's trainer broadcasts, over the group
arealite's trainer already hosts (arealite/weight_sync/group.py: a TCPStore on trainer rank 0, a
PrefixStore named after the group, a ProcessGroupGloo, or ProcessGroupNCCL on a GPU), so the
trainer side is the one it uses for SGLang and the built-in server (docs/vllm.md §4).
vLLM's shipped engines cannot join that group: its `nccl` engine meets the trainer through its
own StatelessProcessGroup and PyNccl communicator, and every shipped engine needs CUDA.

Loading follows vLLM's layer-wise reload (start: layers back to their recorded metadata; each
layer re-processed once all its weights arrived; finish: the rest), the only reload that rebuilds
the CPU GEMM kernels' packed weights, then rebuilds tied heads as the worker extension does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from arealite_vllm_worker import rebuild_tied_layers
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

GROUP_BACKENDS = ("gloo", "nccl")


@dataclass(kw_only=True)
class ArealiteInitInfo(WeightTransferInitInfo):
    """The body arealite's client sends to `/init_weights_update_group` on SGLang, as `init_info`."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str = "gloo"
    timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.backend not in GROUP_BACKENDS:
            raise ValueError(f"init_info.backend={self.backend!r} is not supported; use 'gloo' or 'nccl'")
        if not 0 < self.rank_offset < self.world_size:
            raise ValueError(
                f"init_info.rank_offset={self.rank_offset} must be in 1..world_size-1 (world_size="
                f"{self.world_size}): rank 0 is the trainer"
            )


@dataclass
class ArealiteUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: the tensors the trainer broadcasts next, in this order (vLLM's field names)."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"update_info has {len(self.names)} names, {len(self.dtype_names)} dtype_names and "
                f"{len(self.shapes)} shapes; they must be as many"
            )
        for dtype_name in self.dtype_names:
            if not isinstance(getattr(torch, str(dtype_name), None), torch.dtype):
                raise ValueError(f"update_info.dtype_names has {dtype_name!r}, not a torch dtype name (e.g. 'float32')")


class ArealiteWeightTransferEngine(WeightTransferEngine[ArealiteInitInfo, ArealiteUpdateInfo]):
    """Receives arealite's bucketed broadcast into vLLM's model (module docstring)."""

    init_info_cls = ArealiteInitInfo
    update_info_cls = ArealiteUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group: dist.ProcessGroup | None = None
        self._store: dist.TCPStore | None = None  # must outlive the group
        self._on_device = False  # nccl receives on the worker's device, gloo on the CPU
        self._reloading = False

    def init_transfer_engine(self, init_info: ArealiteInitInfo) -> None:
        """Join the trainer's group (blocks until every member has joined); a group joined
        before is dropped first, as arealite rebuilds its group when servers come and go."""
        self.shutdown()
        parallel = self.parallel_config
        rank = init_info.rank_offset + parallel.data_parallel_index * parallel.world_size + parallel.rank
        if rank >= init_info.world_size:
            raise ValueError(
                f"worker rank {rank} is outside world_size={init_info.world_size}: arealite gives each server "
                "one rank (no tensor or data parallelism inside a server with weight_update=distributed)"
            )
        timeout = timedelta(seconds=float(init_info.timeout))
        store = dist.TCPStore(
            init_info.master_address, int(init_info.master_port), init_info.world_size, is_master=False,
            timeout=timeout,
        )  # fmt: skip
        prefixed = dist.PrefixStore(init_info.group_name, store)
        if init_info.backend == "gloo":
            self.group = dist.ProcessGroupGloo(prefixed, rank, init_info.world_size, timeout)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(prefixed, rank, init_info.world_size, options)
        self._store, self._on_device = store, init_info.backend == "nccl"

    def start_weight_update(self) -> None:
        if self.group is None:
            raise RuntimeError("no weight-update group: POST /init_weight_transfer_engine before /start_weight_update")
        initialize_layerwise_reload(self.model)
        self._reloading = True

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # not the base method: it ends with torch.accelerator.synchronize(), which raises on a CPU
        self.receive_weights(self.parse_update_info(update_info))
        if self._on_device:
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: ArealiteUpdateInfo) -> None:
        """Receive the bucket's tensors by broadcast from rank 0, in order, then load them. The
        whole bucket is received before loading, so a name the model refuses does not leave the
        trainer's broadcast hanging. A failure leaves the model loadable: the reload is finalized
        (layers that got nothing keep their old weights) and the group dropped, which is what
        arealite's trainer expects of a member whose receive failed (it builds a new group)."""
        if self.group is None:
            raise RuntimeError("no weight-update group: POST /init_weight_transfer_engine first")
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        device = self.device if self._on_device else torch.device("cpu")
        try:
            weights = []
            for name, dtype_name, shape in zip(update_info.names, update_info.dtype_names, update_info.shapes):
                tensor = torch.empty([int(d) for d in shape], dtype=getattr(torch, dtype_name), device=device)
                opts = dist.BroadcastOptions()
                opts.rootRank = 0
                self.group.broadcast([tensor], opts).wait()
                weights.append((name, tensor))
            with disable_mtp_completeness_check():
                self.model.load_weights(weights)
        except BaseException:
            self.shutdown()
            self._finalize()
            raise

    def finish_weight_update(self) -> None:
        self._finalize()

    def _finalize(self) -> None:
        if self._reloading:
            self._reloading = False
            finalize_layerwise_reload(self.model, self.model_config)
            rebuild_tied_layers(self.model)

    def shutdown(self) -> None:
        """Drop the group: its connections close, so the other members' pending receives fail at once."""
        self.group, self._store = None, None

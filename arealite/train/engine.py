"""FSDPEngine: a transformers causal LM under FSDP2, trained on packed token-budget micro-batches.

The engine knows no algorithm. `train_batch(batch, loss_fn, loss_weight_fn)` packs the
padded batch, splits it into micro-batches of whole sequences by `mb_spec`, runs forward
and backward on each, and takes one optimizer step. Each micro-batch's loss is scaled by
`loss_weight_fn(mb) / (sum of weights over all micro-batches and ranks)`, so the update
equals the one from the whole global batch at once (FSDP averages gradients over ranks,
which the engine undoes by a factor of world size).

Sharding: `fully_shard` on every decoder layer, then on the root. Mixed precision: bf16
compute with fp32 master weights and fp32 gradient reduction on CUDA; fp32 on CPU
(`config.dtype` pins either). Micro-batches move to the engine's device before the forward,
so `loss_fn` and `post_hook` see every tensor on the device of the logits.
Every rank runs the same number of micro-batches (FSDP's all-gathers must line up); a rank
with fewer sequences than that runs zero-weight filler micro-batches.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any, TypeVar

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from arealite import world
from arealite.config import TrainEngineConfig
from arealite.data.packing import Batch, balanced_partition, pack, select, seqlens_of, split_by_token_budget, unpack
from arealite.interfaces import LossFn, LossWeightFn, PostHook
from arealite.stats.tracker import StatsTracker
from arealite.train import varlen_attention
from arealite.train.data_parallel import balance_across_ranks, join_process_group, leave_process_group
from arealite.train.lm_head import HiddenStates, hidden_states_out, plain_head, takes_hidden_states, warn_unchunked
from arealite.train.lr_schedule import build_scheduler
from arealite.train.step_stats import merge_step_stats
from arealite.train.weights import iter_full_weights, load_full_weights, save_hf
from arealite.utils.hf_weights import read_hf_weights

ModelBuilder = Callable[[str, str], torch.nn.Module]
_Engine = TypeVar("_Engine", bound="FSDPEngine")


def load_causal_lm(path: str, attn_implementation: str) -> torch.nn.Module:
    """The default model builder: an HF causal LM in fp32 (master weights)."""
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(path):  # else transformers reports a confusing hub repo-id error
        raise FileNotFoundError(
            f"model folder {path!r} does not exist; set actor.path (or ref.path) to a local HF model folder"
        )

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)


def _attn_implementation(device: torch.device, dtype: torch.dtype) -> str:
    # Packed rows need attention confined per sequence. flash-attn takes cu_seqlens on CUDA
    # (in bf16/fp16 only); elsewhere our varlen sdpa attends segments of the row (transformers' own sdpa
    # path would build a dense N x N block-diagonal mask: quadratic in the micro-batch's tokens).
    if device.type == "cuda" and dtype in (torch.bfloat16, torch.float16):
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return varlen_attention.register()


class FSDPEngine:
    """A sharded model, its optimizer and micro-batched forward/backward. Collective API.

    Construction only validates; `initialize()` joins the process group, loads and shards the
    model and builds the optimizer. `total_optimizer_steps` (needed by warmup and decaying lr
    schedules) counts optimizer steps; the actor and critic take training steps and multiply.
    `build_model(path, attn_implementation)` lets a critic swap in a value head.
    """

    def __init__(
        self,
        config: TrainEngineConfig,
        total_optimizer_steps: int | None = None,
        build_model: ModelBuilder = load_causal_lm,
    ) -> None:
        if not config.path:
            raise ValueError("TrainEngineConfig.path is empty; set it to an HF model folder (e.g. actor.path=...)")
        self.config = config
        self.total_optimizer_steps = total_optimizer_steps
        self._build_model = build_model
        self._model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self.version = 0  # weight version of the current parameters; set by the weight sync
        self._in_process_group = False  # counted among the default group's engines (see join_process_group)
        self._head: torch.nn.Linear | None = None
        self._warned_head = False

    def initialize(self) -> FSDPEngine:
        """Join the process group, load and shard the model, build AdamW; collective. Returns self."""
        if self._model is not None:
            return self
        join_process_group()
        self._in_process_group = True
        config = self.config
        self.device = world.device()
        self.compute_dtype = self._compute_dtype(config.dtype)
        model = self._build_model(config.path, _attn_implementation(self.device, self.compute_dtype))
        self.hf_config = model.config
        if config.lora is not None:  # before sharding, so the adapter is sharded with its layer
            from arealite.train.lora import apply_lora

            model = apply_lora(model, config.lora)
        if config.gradient_checkpointing:
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
                model.activation_checkpointing_enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._model = self._shard(model)
        self._head = plain_head(model) if config.head_chunk_tokens > 0 else None  # chunked through the loss
        if config.optimizer is not None:
            opt = config.optimizer
            trainable = [p for p in self._model.parameters() if p.requires_grad]  # LoRA: the adapter only
            self.optimizer = torch.optim.AdamW(
                trainable, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps,
                weight_decay=opt.weight_decay,
            )  # fmt: skip
            self.scheduler = build_scheduler(self.optimizer, opt, self.total_optimizer_steps)
        return self

    @property
    def model(self) -> torch.nn.Module:
        if self._model is None:
            raise RuntimeError(f"{type(self).__name__} is not initialized; call .initialize() first")
        return self._model

    @property
    def has_lora(self) -> bool:
        """Whether the engine trains a LoRA adapter (`config.lora`): `save` then writes the adapter alone."""
        return self.config.lora is not None

    @property
    def activation_checkpointing(self) -> bool:
        """Whether any module recomputes activations in backward (any transformers 5.x)."""
        return any(getattr(m, "gradient_checkpointing", False) is True for m in self.model.modules())

    def set_version(self, version: int) -> None:
        """Record the weight version the servers now hold (called by the weight sync)."""
        self.version = version

    def get_version(self) -> int:
        return self.version

    def destroy(self) -> None:
        """Drop the model and optimizer. The default process group ends with the last engine
        when an engine started it (one already up, e.g. torchrun's, stays)."""
        self._model = self.optimizer = self.scheduler = None
        if self._in_process_group:
            self._in_process_group = False
            leave_process_group()

    def __enter__(self: _Engine) -> _Engine:
        """`with PPOActor(...) as actor:` initializes, and destroys on exit (errors included)."""
        try:
            self.initialize()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    # ---- setup ----

    def _compute_dtype(self, dtype: str) -> torch.dtype:
        if dtype == "auto":
            return torch.bfloat16 if self.device.type == "cuda" else torch.float32
        return getattr(torch, dtype)

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        mesh = init_device_mesh(self.device.type, (world.world_size(),))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if self.compute_dtype != torch.float32:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        if self.config.cpu_offload and self.device.type == "cuda":  # on CPU the weights already live there
            kwargs["offload_policy"] = CPUOffloadPolicy()
        layer_types = set(getattr(model, "_no_split_modules", None) or [])
        layers = [m for m in model.modules() if type(m).__name__ in layer_types]
        if not layers:
            raise ValueError(f"cannot find decoder layers ({sorted(layer_types)}) in {type(model).__name__}")
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # ---- micro-batching ----

    def _micro_batches(self, batch: Batch) -> list[tuple[Batch, list[int] | None]]:
        """Packed micro-batches of this rank, padded with fillers to the max count over ranks.

        Returns (packed micro-batch, its rows of `batch`) pairs; rows is None for a filler.
        """
        if batch["attention_mask"].shape[0] == 0:
            raise ValueError("empty batch: every trainer rank needs at least one sequence")
        lens = seqlens_of(batch["attention_mask"]).tolist()
        spec = self.config.mb_spec
        groups = split_by_token_budget(lens, spec.max_tokens_per_mb, spec.n_mbs)
        n = int(world.all_reduce(torch.tensor(len(groups)), "max"))
        if n > len(groups):
            groups = split_by_token_budget(lens, spec.max_tokens_per_mb, n)
        # longest first within a row: equal lengths sit together (one varlen sdpa call each), short ones too
        groups = [sorted(g, key=lambda i: (-lens[i], i)) for g in groups]
        out: list[tuple[Batch, list[int] | None]] = [(pack(select(batch, g)), g) for g in groups]
        while len(out) < n:  # fewer sequences here than micro-batches elsewhere
            filler = pack(select(batch, [0]))
            if "loss_mask" in filler:
                filler["loss_mask"] = torch.zeros_like(filler["loss_mask"])
            out.append((filler, None))
        return out

    def _to_device(self, mb: Batch) -> Batch:
        """The packed micro-batch with every tensor on the engine's device."""
        return {k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in mb.items()}

    def _forward_packed(self, mb: Batch, hidden: bool = False) -> torch.Tensor | HiddenStates:
        """Logits [N, V] of one packed micro-batch (attention confined per sequence); with `hidden`
        and N > `head_chunk_tokens` > 0, the `HiddenStates` they come from (arealite/train/lm_head.py)."""
        if hidden and self._head is None and self.config.head_chunk_tokens > 0 and not self._warned_head:
            self._warned_head = True
            warn_unchunked(self.model)
        head = self._head if hidden and mb["input_ids"].shape[0] > self.config.head_chunk_tokens else None
        longest = int((mb["cu_seqlens"][1:] - mb["cu_seqlens"][:-1]).max())  # the attention needs it as an int
        ids = mb["input_ids"].to(self.device)[None]
        pos = mb["position_ids"].to(self.device)[None]
        cu = mb["cu_seqlens"].to(self.device, torch.int32)
        with hidden_states_out(head) if head is not None else nullcontext({}) as seen:
            out = self.model(
                input_ids=ids, position_ids=pos, use_cache=False,
                cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest,
            )  # fmt: skip
        y = out.logits.squeeze(0)  # its backward allocates nothing; indexing [0] would zero-fill [1, N, V]
        return HiddenStates(y, seen["weight"], self.config.head_chunk_tokens) if head is not None else y

    # ---- public API ----

    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> dict[str, float]:
        """One optimizer step on this rank's padded `batch`; collective. Returns reduced stats:
        loss_fn's (weighted by loss weight), grad_norm, lr, loss_weight, update_skipped, and
        masked_share (of the attention scores computed, the share masked out; over ranks, filler
        micro-batches count whole)."""
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer (config.optimizer is None): it is frozen")
        self.optimizer.zero_grad(set_to_none=True)
        acc, total = self._accumulate_gradients(batch, loss_fn, loss_weight_fn)
        grad_norm = self._clip_gradients()
        lr = self.optimizer.param_groups[0]["lr"]
        stepped = total > 0 and math.isfinite(grad_norm)
        if stepped:  # the same decision on every rank: total and grad_norm are global
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        out = acc.export()
        out.update(grad_norm=grad_norm, lr=lr, loss_weight=total, update_skipped=float(not stepped))
        return out

    def train_minibatches(
        self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn, n_minibatches: int, setting: str
    ) -> dict[str, float]:
        """`n_minibatches` optimizer steps over this rank's `batch`; collective. The update's stats
        (`merge_step_stats` of the steps').

        The PPO update of the actor and of the critic: balance the sequences across ranks (with
        `mb_spec.balance_across_ranks`), split them into minibatches of about equal token counts,
        and `train_batch` each. `setting` names the config key of `n_minibatches` for the error
        raised when this rank holds fewer sequences than minibatches.
        """
        if self.config.mb_spec.balance_across_ranks:
            batch = balance_across_ranks(batch)
        lens = seqlens_of(batch["attention_mask"]).tolist()
        if len(lens) < n_minibatches:
            raise ValueError(f"this rank holds {len(lens)} sequences, fewer than {setting}={n_minibatches}")
        return merge_step_stats(
            [
                self.train_batch(select(batch, rows), loss_fn, loss_weight_fn)
                for rows in balanced_partition(lens, n_minibatches)
            ]
        )

    def _accumulate_gradients(
        self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn
    ) -> tuple[StatsTracker, float]:
        """Forward/backward over all micro-batches; grads hold d(global weighted loss)/dθ."""
        self.model.train()
        mbs = self._micro_batches(batch)
        weights = [0.0 if rows is None else float(loss_weight_fn(mb)) for mb, rows in mbs]
        total = float(world.all_reduce(torch.tensor(sum(weights), dtype=torch.float64), "sum"))
        acc = StatsTracker()
        for i, (mb, rows) in enumerate(mbs):
            self.model.set_requires_gradient_sync(i == len(mbs) - 1)  # reduce-scatter once, at the end
            mb = self._to_device(mb)
            loss, stats = loss_fn(self._forward_packed(mb, takes_hidden_states(loss_fn)), mb)
            scale = weights[i] / total * world.world_size() if total > 0 else 0.0
            (loss * scale).backward()
            if rows is not None:
                acc.add({"loss": loss.detach(), **stats}, weights[i])
            acc.scalar("masked_share", *self._masked(mb, filler=rows is None))
        return acc, total

    def _masked(self, mb: Batch, filler: bool) -> tuple[float, float]:
        """(masked share, scores computed) of a packed micro-batch's attention: a filler is all
        waste; flash-attn computes only the causal scores of each sequence; the varlen sdpa
        also computes the masked pairs of the short sequences that share a call."""
        lens = (mb["cu_seqlens"][1:] - mb["cu_seqlens"][:-1]).tolist()
        if filler or self.hf_config._attn_implementation != varlen_attention.NAME:
            causal = float(sum(n * (n + 1) // 2 for n in lens))
            return float(filler), causal
        needed, computed = varlen_attention.scores(lens)
        return 1.0 - needed / computed, float(computed)

    def _clip_gradients(self) -> float:
        max_norm = self.config.optimizer.gradient_clipping
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(norm)

    @torch.no_grad()
    def forward(self, batch: Batch, post_hook: PostHook | None = None) -> torch.Tensor:
        """Per-token outputs `[B, T, ...]` aligned with the padded batch; collective.

        Without `post_hook` the logits themselves come back ([B, T, V]: small models only).
        """
        self.model.eval()
        B, T = batch["attention_mask"].shape
        result: torch.Tensor | None = None
        for mb, rows in self._micro_batches(batch):
            mb = self._to_device(mb)
            if post_hook is None:
                y = self._forward_packed(mb)
            else:
                y = post_hook(self._forward_packed(mb, takes_hidden_states(post_hook)), mb)
            if rows is None:
                continue
            padded = unpack(y.detach(), mb["cu_seqlens"].to(y.device), T).cpu()
            if result is None:
                result = padded.new_zeros((B, *padded.shape[1:]))
            result[torch.as_tensor(rows)] = padded
        return result

    def save(self, path: str) -> None:
        """Write the model as an HF folder (config, safetensors, tokenizer files); collective.
        With `config.lora`, the adapter alone as a peft folder (train/lora.py)."""
        if self.config.lora is not None:
            from arealite.train.lora import save_adapter

            return save_adapter(self.model, self.config.lora, path, base_model_path=self.config.path)
        save_hf(self.model, self.hf_config, path, source_path=self.config.path)

    def load(self, path: str) -> None:
        """Load weights from an HF folder into the sharded model (every rank reads the files);
        with `config.lora`, an adapter folder that `save` wrote."""
        if self.config.lora is not None:
            from arealite.train.lora import load_adapter

            return load_adapter(self.model, path)
        load_full_weights(self.model, read_hf_weights(path))

    def save_checkpoint(self, path: str) -> None:
        """Write resumable state (sharded weights, optimizer, lr schedule) to `path`; collective."""
        from arealite.train.checkpoint import save_train_state

        save_train_state(self.model, self.optimizer, self.scheduler, path)

    def load_checkpoint(self, path: str) -> None:
        """Restore what `save_checkpoint` wrote (same engine config); collective."""
        from arealite.train.checkpoint import load_train_state

        load_train_state(self.model, self.optimizer, self.scheduler, path)

    def export_weights(self, dtype: torch.dtype | None = None):
        """Iterator of (name, full tensor); collective — every rank must exhaust it. On a one-rank
        trainer the tensors are views of the live parameters, like `state_dict()`: clone to keep them."""
        return iter_full_weights(self.model, dtype)

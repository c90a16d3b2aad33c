"""The lean forward (`--model-impl arealite`): Qwen2/Llama/Mistral decoders computed directly
from the weights of the loaded transformers model, over the preallocated KV cache (kv_cache.py).

On a CPU a small model's decode step is mostly Python in transformers' modules; here a layer is
about twenty tensor operations, with q/k/v and gate/up each one fused matmul. The fused buffers
hold the transformers parameters as views, so every weight update reaches both forwards, and
the arithmetic follows transformers' so logits agree to rounding (tested in fp32). LoRA
adapters apply through `AdapterSet.add_to`, as on the transformers path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from arealite.server.kv_cache import KVCache

SUPPORTED = ("llama", "mistral", "qwen2")  # model_type values: pre-norm decoders with rotary, GQA, SwiGLU


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the lean forward cannot run `model` (None: it can)."""
    config = model.config
    if config.model_type not in SUPPORTED:
        return f"model_type {config.model_type!r} is not one of {SUPPORTED}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} is not silu"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "some layers use sliding-window attention"
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return "mistral with a sliding window"
    rope = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope_type = str(getattr(rope, "rope_type", ""))
    if rope is None or "dynamic" in rope_type or rope_type == "longrope":
        return f"rotary type {rope_type or 'unknown'!r} depends on the sequence length"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (
            len({m.bias is None for m in (attn.q_proj, attn.k_proj, attn.v_proj)}) > 1
            or len({m.bias is None for m in (mlp.gate_proj, mlp.up_proj)}) > 1
        ):
            return "q/k/v (or gate/up) projections differ in having a bias"
    return None


@dataclass
class _Layer:
    """One decoder layer's weights (views into the transformers parameters) and LoRA names."""

    norm1: torch.Tensor
    eps1: float
    qkv: torch.Tensor  # [(H + 2 H_kv) * D, hidden], fused
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    norm2: torch.Tensor
    eps2: float
    gate_up: torch.Tensor  # [2 * I, hidden], fused
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    # LoRA: per fused matmul, (module's HF name, first output column, end column) of each part
    lora_qkv: tuple[tuple[str, int, int], ...]
    lora_o: tuple[tuple[str, int, int], ...]
    lora_gate_up: tuple[tuple[str, int, int], ...]
    lora_down: tuple[tuple[str, int, int], ...]


def _spans(names: dict[int, str], linears: list[torch.nn.Linear]) -> tuple[tuple[str, int, int], ...]:
    """(HF name, first column, end column) of each linear's part of their fused output."""
    spans, offset = [], 0
    for m in linears:
        spans.append((names[id(m)], offset, offset + m.out_features))
        offset += m.out_features
    return tuple(spans)


def _fuse(linears: list[torch.nn.Linear], attr: str) -> torch.Tensor | None:
    """Concatenate the linears' `attr` (weight or bias) and make each one a view into the result."""
    if getattr(linears[0], attr) is None:
        return None
    fused = torch.cat([getattr(m, attr).detach() for m in linears])
    offset = 0
    for m in linears:
        n = m.out_features
        setattr(m, attr, torch.nn.Parameter(fused[offset : offset + n], requires_grad=False))
        offset += n
    return fused


class LeanModel:
    """Prefill and decode over a KVCache with the weights of a transformers causal LM."""

    name = "arealite"

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, device: str):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the lean forward cannot run this model: {reason}")
        self.model, self.dtype, self.device = model, dtype, torch.device(device)
        self.lora = None  # the runner's AdapterSet, set by the runner
        attn = model.model.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = attn.q_proj.out_features // self.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.group = self.heads // self.kv_heads
        self.scaling = float(attn.scaling)
        self.intermediate = model.model.layers[0].mlp.gate_proj.out_features
        self._cos = self._sin = torch.zeros(0)
        self._build()

    # ---- weights ---------------------------------------------------------------------------

    def _build(self) -> None:
        names = {id(m): n for n, m in self.model.named_modules()}
        self.layers: list[_Layer] = []
        self._installed: list[tuple[torch.nn.Module, str, torch.nn.Parameter]] = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
                gate_up = [mlp.gate_proj, mlp.up_proj]
                fused = {"qkv": _fuse(qkv, "weight"), "qkv_bias": _fuse(qkv, "bias")}
                fused.update(gate_up=_fuse(gate_up, "weight"), gate_up_bias=_fuse(gate_up, "bias"))
                for m in qkv + gate_up:
                    self._installed += [(m, a, getattr(m, a)) for a in ("weight", "bias") if getattr(m, a) is not None]
                norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
                self.layers.append(
                    _Layer(
                        norm1=norm1.weight,
                        eps1=float(norm1.variance_epsilon),
                        qkv=fused["qkv"],
                        qkv_bias=fused["qkv_bias"],
                        o=attn.o_proj.weight,
                        o_bias=attn.o_proj.bias,
                        norm2=norm2.weight,
                        eps2=float(norm2.variance_epsilon),
                        gate_up=fused["gate_up"],
                        gate_up_bias=fused["gate_up_bias"],
                        down=mlp.down_proj.weight,
                        down_bias=mlp.down_proj.bias,
                        lora_qkv=_spans(names, qkv),
                        lora_o=_spans(names, [attn.o_proj]),
                        lora_gate_up=_spans(names, gate_up),
                        lora_down=_spans(names, [mlp.down_proj]),
                    )
                )
        self.embed = self.model.model.embed_tokens.weight
        self.norm, self.norm_eps = self.model.model.norm.weight, float(self.model.model.norm.variance_epsilon)
        self.lm_head = self.model.lm_head
        self.lora_lm_head = _spans(names, [self.lm_head])

    def refresh(self) -> None:
        """After a weight update: re-fuse if a fused parameter was replaced instead of copied into."""
        if any(getattr(m, attr) is not p for m, attr, p in self._installed):
            self._build()

    def _rope(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin tables [length, D] in the model's dtype, from the model's own
        rotary module (so every rope type it computes statically agrees with transformers)."""
        if self._cos.shape[0] < length:
            n = max(length, 2 * self._cos.shape[0], 256)
            positions = torch.arange(n, device=self.device)[None]
            cos, sin = self.model.model.rotary_emb(self.embed[:1], positions)
            half = self.head_dim // 2
            # rotate_half(x) * sin == swap_halves(x) * [-sin_1, sin_2]: the sign moves onto sin.
            self._cos, self._sin = cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        return self._cos, self._sin

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """transformers' apply_rotary_pos_emb on x [..., heads, D] with broadcastable tables."""
        swapped = x.roll(self.head_dim // 2, -1)  # the two halves swapped
        return x * cos + swapped * sin

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, eps)
        # transformers normalizes in fp32 and rounds to the model's dtype BEFORE the weight
        return weight * F.rms_norm(x.float(), weight.shape, eps=eps).to(x.dtype)

    def _linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lora: tuple[tuple[str, int, int], ...]
    ) -> torch.Tensor:
        """x @ weight.T + bias, plus the active adapters of each (module, a, b) in `lora` on output columns [a, b)."""
        out = F.linear(x, weight, bias)
        if self.lora is not None and self.lora.active:
            for name, a, b in lora:
                self.lora.add_to(name, x, out[..., a:b])
        return out

    # ---- the forward -----------------------------------------------------------------------

    def new_batch(self) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device)

    def _layer(self, x: torch.Tensor, i: int, attend) -> torch.Tensor:
        """One decoder layer on x [..., hidden]; `attend(i, qk, v)` does rotary, cache and attention."""
        layer, d = self.layers[i], self.head_dim
        qk_width = (self.heads + self.kv_heads) * d
        h = self._norm(x, layer.norm1, layer.eps1)
        qkv = self._linear(h, layer.qkv, layer.qkv_bias, layer.lora_qkv)
        attn = attend(
            i,
            qkv[..., :qk_width].unflatten(-1, (self.heads + self.kv_heads, d)),
            qkv[..., qk_width:].unflatten(-1, (self.kv_heads, d)),
        )
        x = x + self._linear(attn, layer.o, layer.o_bias, layer.lora_o)
        h = self._norm(x, layer.norm2, layer.eps2)
        gate_up = self._linear(h, layer.gate_up, layer.gate_up_bias, layer.lora_gate_up)
        inter = self.intermediate
        act = F.silu(gate_up[..., :inter]) * gate_up[..., inter:]
        return x + self._linear(act, layer.down, layer.down_bias, layer.lora_down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        h = self._norm(x, self.norm, self.norm_eps)
        return self._linear(h, self.lm_head.weight, self.lm_head.bias, self.lora_lm_head).float()

    def prefill(self, cache: KVCache, prompts: list[list[int]], all_logits: bool) -> torch.Tensor:
        """Prompts appended to `cache` as new rows; fp32 logits [n, V] at each prompt's last
        token, or with `all_logits` [n, L, V] LEFT-padded (the transformers path's layout)."""
        n, length = len(prompts), max(len(p) for p in prompts)
        lens = [len(p) for p in prompts]
        # Right padding: a token's column is its position, and causal attention keeps every
        # real query away from the padding after it (no padding mask, no fully masked row).
        ids = torch.zeros(n, length, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        start = cache.reserve(n, length)
        cos, sin = self._rope(length)
        cos, sin = cos[:length, None, :], sin[:length, None, :]  # [L, 1, D] against [n, L, heads, D]

        def attend(i: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            qk = self._rotate(qk, cos, sin).transpose(1, 2)  # [n, H + H_kv, L, D]
            q, k, v = qk[:, : self.heads], qk[:, self.heads :], v.transpose(1, 2)
            cache.write_prefill(i, start, k, v)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, enable_gqa=self.group > 1)
            return out.transpose(1, 2).flatten(2)  # [n, L, H * D]

        x = F.embedding(ids.to(self.device), self.embed)
        for i in range(len(self.layers)):
            x = self._layer(x, i, attend)
        cache.commit(lens)
        if not all_logits:
            last = torch.tensor(lens, device=self.device) - 1
            return self._logits(x[torch.arange(n, device=self.device), last])
        logits = self._logits(x)
        left = torch.zeros_like(logits)
        for i, m in enumerate(lens):
            left[i, length - m :] = logits[i, :m]
        return left

    def decode(self, cache: KVCache, tokens: torch.Tensor) -> torch.Tensor:
        """One pending token per row ([B] long); writes its key/value; fp32 logits [B, V]."""
        batch = tokens.shape[0]
        pos, width, mask = cache.begin_decode()
        cos, sin = self._rope(width)
        cos, sin = cos[pos][:, None, :], sin[pos][:, None, :]  # [B, 1, D]

        def attend(i: int, qk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            qk = self._rotate(qk, cos, sin)  # [B, H + H_kv, D]
            cache.write_decode(i, qk[:, self.heads :], v)
            # The query heads sharing a kv head become that head's query rows (one query each),
            # so sdpa reads the cache as it is, without repeating kv heads.
            q = qk[:, : self.heads].unflatten(1, (self.kv_heads, self.group))  # [B, H_kv, G, D]
            keys, values = cache.keys(i)[:batch, :, :width], cache.values(i)[:batch, :, :width]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
            return out.flatten(1)  # [B, H * D], head h = kv_head * G + g as transformers' repeat_kv

        x = F.embedding(tokens.to(self.device), self.embed)
        for i in range(len(self.layers)):
            x = self._layer(x, i, attend)
        cache.end_decode()
        return self._logits(x)

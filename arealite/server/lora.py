"""LoRA adapters on the built-in server, with SGLang's endpoints (`--enable-lora`; docs/lora.md).

`POST /load_lora_adapter {"lora_name", "lora_path"}` reads a peft adapter folder
(`adapter_config.json`, `adapter_model.safetensors`) under a name; `POST
/unload_lora_adapter {"lora_name"}` drops it; `/generate` picks one per sequence with
`lora_path` (a name, a list of names or nulls for a batch; absent or null: the base model).
Replies are SGLang's: `{"success", "error_message", "loaded_adapters": {name: path}}`, 400
on failure. `/v1/models` lists loaded adapters with `parent` set to the base model.

How adapters apply: the base weights are never touched. At every adapted linear layer,
`AdapterSet.add_to` adds `scaling * x @ A^T @ B^T` to the rows of the batch whose sequence
uses that adapter (several adapters and the base model can share one batch, as in S-LoRA):
called by the lean forward (lean_model.py) after each projection, and by a forward hook on
the module on the transformers path.
The scheduler tells the model runner which adapter each row uses (`AdapterSet.rows`).
Differences from SGLang: an unload returns at once, and requests already running finish on
the adapter they started with (SGLang waits for them before answering); adapters are read
only from a directory on the server, never downloaded.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from aiohttp import web

from arealite.server.errors import BadBody, RequestError, json_body, json_response

_PREFIX = "base_model.model."  # peft saves names under its PeftModel wrapper


@dataclass
class Adapter:
    name: str
    path: str
    rank: int
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )  # module -> (A [r, in], B [out, r])


class AdapterSet:
    """The loaded adapters of one served model and the hooks that apply them."""

    def __init__(
        self, model: torch.nn.Module, lock: threading.RLock, enabled: bool = False, max_rank: int | None = None,
        target_modules: list[str] | None = None, max_loaded: int | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        self.lock = lock  # the model runner's: no forward runs while adapters change
        self.enabled = enabled
        self.max_rank = max_rank
        self.target_modules = set(target_modules) if target_modules and "all" not in target_modules else None
        self.max_loaded = max_loaded
        self.adapters: dict[str, Adapter] = {}
        self._hooked: set[str] = set()
        self._groups: list[tuple[Adapter, torch.Tensor | None]] = []  # the current forward's rows per adapter
        self._device = next(model.parameters()).device

    # ---- loading ------------------------------------------------------------------------

    def load(self, name: str, path: str) -> None:
        """Read the adapter at `path` and serve it as `name`; ValueError with SGLang's wording."""
        if not self.enabled:
            raise ValueError("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        self._check_room(name, path)
        adapter = self._read(name, path)  # outside the lock: forwards go on meanwhile
        with self.lock:
            self._check_room(name, path)  # a concurrent load may have taken the name
            for module in adapter.weights:
                if module not in self._hooked:
                    self.model.get_submodule(module).register_forward_hook(self._hook(module))
                    self._hooked.add(module)
            self.adapters[name] = adapter

    def _check_room(self, name: str, path: str) -> None:
        if name in self.adapters:
            raise ValueError(f"Failed to load LoRA adapter {name} because it is already loaded")
        if self.max_loaded is not None and len(self.adapters) >= self.max_loaded:
            raise ValueError(
                f"Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded LoRA adapters is "
                f"{self.max_loaded}. Please unload some LoRA adapters before loading new ones."
            )

    def unload(self, name: str) -> None:
        if not self.enabled:
            raise ValueError("LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if name not in self.adapters:
            raise ValueError(f"LoRA with name {name} does not exist. Loaded LoRAs: {sorted(self.adapters)}")
        with self.lock:
            del self.adapters[name]  # running requests keep their reference until they finish

    def loaded(self) -> dict[str, str]:
        return {name: a.path for name, a in self.adapters.items()}

    def _read(self, name: str, path: str) -> Adapter:
        if not os.path.isdir(path):
            raise ValueError(
                f"lora_path {path[:300]!r} is not an adapter directory on this server (the built-in server downloads "
                "nothing)"
            )
        try:
            with open(os.path.join(path, "adapter_config.json")) as f:
                config = json.load(f)
            from arealite.utils.hf_weights import read_safetensors

            tensors = read_safetensors(os.path.join(path, "adapter_model.safetensors"))
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot read the peft adapter at {path!r}: {e}") from e
        rank, alpha = int(config.get("r", 0)), float(config.get("lora_alpha", 0))
        if (
            rank < 1
            or config.get("use_dora")
            or config.get("modules_to_save")
            or config.get("peft_type", "LORA") != "LORA"
        ):
            raise ValueError(
                f"the adapter at {path!r} is not a plain LoRA adapter (r >= 1, no DoRA, no modules_to_save)"
            )
        if self.max_rank is not None and rank > self.max_rank:
            raise ValueError(f"LoRA adapter {name} with rank {rank} exceeds --max-lora-rank {self.max_rank}")
        scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        adapter = Adapter(name, path, rank, scaling)
        param = next(self.model.parameters())
        for key in sorted(tensors):
            if ".lora_A." not in key:
                if ".lora_B." not in key:
                    raise ValueError(f"the adapter at {path!r} holds {key!r}, which is not a lora_A/lora_B weight")
                continue
            module = key.removeprefix(_PREFIX).split(".lora_A.")[0]
            a, b = tensors[key], tensors.get(key.replace(".lora_A.", ".lora_B."))
            adapter.weights[module] = self._checked(path, module, a, b, rank, param)
        if not adapter.weights:
            raise ValueError(f"the adapter at {path!r} holds no lora_A/lora_B weights")
        return adapter

    def _checked(self, path, module, a, b, rank, param) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            layer = self.model.get_submodule(module)
        except AttributeError:
            layer = None
        if not isinstance(layer, torch.nn.Linear):
            raise ValueError(
                f"the adapter at {path!r} adapts {module!r}, which is not a linear layer of the served model"
            )
        if self.target_modules is not None and module.rsplit(".", 1)[-1] not in self.target_modules:
            raise ValueError(
                f"the adapter at {path!r} adapts {module!r}, outside --lora-target-modules "
                f"{sorted(self.target_modules)}"
            )
        want_a, want_b = [rank, layer.in_features], [layer.out_features, rank]
        if b is None or list(a.shape) != want_a or list(b.shape) != want_b:
            got = (list(a.shape), None if b is None else list(b.shape))
            raise ValueError(
                f"the adapter at {path!r} has lora_A/lora_B of shapes {got} for {module!r}; expected {want_a} and "
                f"{want_b}"
            )
        return a.to(param.device, param.dtype), b.to(param.device, param.dtype)

    # ---- applying -----------------------------------------------------------------------

    def resolve(self, name: str | None) -> Adapter | None:
        """The adapter a request names (None: the base model); RequestError if unknown."""
        if name is None:
            return None
        if not self.enabled:
            raise RequestError(
                f"LoRA adapter '{name}' was requested, but LoRA is not enabled. Please launch the server with "
                "--enable-lora flag and preload adapters using --lora-paths or /load_lora_adapter endpoint."
            )
        adapter = self.adapters.get(name)
        if adapter is None:
            raise RequestError(
                f"The following requested LoRA adapters are not loaded: {name}\nLoaded adapters: "
                f"{sorted(self.adapters)}."
            )
        return adapter

    @contextmanager
    def rows(self, adapters: list[Adapter | None] | None) -> Iterator[None]:
        """During one forward (model lock held), row i of the batch uses `adapters[i]`."""
        groups: dict[int, tuple[Adapter, list[int]]] = {}
        for i, adapter in enumerate(adapters or ()):
            if adapter is not None:
                groups.setdefault(id(adapter), (adapter, []))[1].append(i)
        n = len(adapters or ())
        self._groups = [(a, None if len(r) == n else torch.tensor(r, device=self._device)) for a, r in groups.values()]
        try:
            yield
        finally:
            self._groups = []

    @property
    def active(self) -> bool:
        """Whether the current forward has rows on an adapter."""
        return bool(self._groups)

    def add_to(self, module: str, x: torch.Tensor, out: torch.Tensor) -> None:
        """In place: add to `out` (module's output on input `x`, rows first) each active
        adapter's `scaling * x @ A^T @ B^T` on that adapter's rows."""
        for adapter, rows in self._groups:
            ab = adapter.weights.get(module)
            if ab is None:
                continue
            xs = x if rows is None else x[rows]
            delta = (xs @ ab[0].T) @ ab[1].T * adapter.scaling  # peft's order: B(A(x)) * scaling
            if rows is None:
                out += delta
            else:
                out.index_add_(0, rows, delta)

    def _hook(self, module: str):
        def add_adapters(layer: torch.nn.Module, args: tuple, output: torch.Tensor):
            self.add_to(module, args[0], output)
            return output

        return add_adapters


# ---- HTTP -------------------------------------------------------------------------------


def lora_paths(body: dict, size: int) -> list[str | None]:
    """`/generate`'s `lora_path` per prompt: one name for all, or a list with one per prompt."""
    value = body.get("lora_path")
    values = value if isinstance(value, list) else [value] * size
    if len(values) != size:
        raise RequestError(f"lora_path has {len(values)} entries but the batch has {size} prompts.")
    for v in values:
        if v is not None and not isinstance(v, str):
            raise RequestError(
                f"lora_path must be an adapter name (a string), a list of them, or null; got {str(v)[:80]}."
            )
    return [v or None for v in values]


def _result(adapters: AdapterSet, error: str = "") -> web.Response:
    body = {"success": not error, "error_message": error, "loaded_adapters": adapters.loaded()}
    return json_response(body, status=400 if error else 200)


def _name(body: dict) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise BadBody(f"1 validation error: lora_name must be a non-empty string, got {str(name)[:80]}")
    return name


@json_body
async def handle_load(request: web.Request, body: dict) -> web.Response:
    state = request.app["state"]
    adapters: AdapterSet = state.runner.lora
    name, path = _name(body), body.get("lora_path")
    if not isinstance(path, str) or not path:
        raise BadBody(
            f"1 validation error: lora_path must be a non-empty string (an adapter directory), got {str(path)[:80]}"
        )
    try:
        await state.run_blocking(adapters.load, name, path)
    except ValueError as e:
        return _result(adapters, str(e))
    return _result(adapters)


@json_body
async def handle_unload(request: web.Request, body: dict) -> web.Response:
    adapters: AdapterSet = request.app["state"].runner.lora
    name = _name(body)
    try:
        adapters.unload(name)
    except ValueError as e:
        return _result(adapters, str(e))
    return _result(adapters)


def model_cards(adapters: AdapterSet, parent: str, created: int, context_len: int) -> list[dict]:
    """`/v1/models` entries of the loaded adapters (SGLang: id = name, root = path, parent = base)."""
    return [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "sglang",
            "root": path,
            "parent": parent,
            "max_model_len": context_len,
        }
        for name, path in adapters.loaded().items()
    ]

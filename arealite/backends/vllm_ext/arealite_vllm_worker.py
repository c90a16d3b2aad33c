"""arealite's methods on vLLM's worker (`--worker-extension-cls arealite_vllm_worker.ArealiteWorker`).

Runs inside vLLM's own environment, so it imports only what vLLM brings. vLLM puts this class
among its worker's bases (its supported extension point for RL frameworks), and the client calls
the method by name through `POST /collective_rpc` (docs/vllm.md §1).

Why it exists: vLLM's `reload_weights` re-processes a layer only when the checkpoint loads a
weight into it. A model with tied word embeddings (SmolLM2, Qwen2.5-0.5B/1.5B) has no
`lm_head.weight` to load: the head shares the embedding's tensor, which the reload updates in
place, but on a CPU the head computes its logits with a copy of that tensor packed for the GEMM
kernel when the model was first loaded (vLLM's `dispatch_cpu_unquantized_gemm`). That copy is
never repacked, so after a reload the server samples from the old head over the new body.

Importing it also registers arealite's weight-transfer engine (arealite_vllm_transfer.py) in
vLLM's registry: vLLM imports this module in every worker process before the worker loads the
model and builds its engine, so no plugin install is needed (docs/vllm.md §4).
"""

from __future__ import annotations

from typing import Any

ENGINE_NAME = "arealite"  # --weight-transfer-config '{"backend": "arealite"}' (arealite.backends.vllm.TRANSFER_ENGINE)


def register_transfer_engine() -> None:
    """Register arealite's engine by module path: its module is imported only by a server that asks for it."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(
            ENGINE_NAME, "arealite_vllm_transfer", "ArealiteWeightTransferEngine"
        )
    except ValueError:  # already registered: this module was imported before in this process
        pass


try:
    register_transfer_engine()
except ImportError:  # imported outside vLLM's environment (arealite's own tests of the helpers below)
    pass


def _tied_layers(model: Any) -> list[Any]:
    """Layers whose weight is the same tensor as an earlier layer's: tied heads, never loaded by name."""
    seen: set[int] = set()
    tied = []
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None or getattr(module, "quant_method", None) is None:
            continue
        if id(weight) in seen:
            tied.append(module)
        seen.add(id(weight))
    return tied


def rebuild_tied_layers(model: Any) -> int:
    """Re-run the kernel processing of the layers that share another layer's weight, from the
    (now new) shared tensor. Returns how many were rebuilt."""
    tied = _tied_layers(model)
    for layer in tied:
        layer.quant_method.process_weights_after_loading(layer)
    return len(tied)


class ArealiteWorker:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def arealite_reload_weights(self, weights_path: str) -> int:
        """vLLM's in-place reload from `weights_path`, then the tied layers' kernel state rebuilt
        from their (now new) shared weight. Returns how many tied layers were rebuilt."""
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return rebuild_tied_layers(self.model_runner.get_model())

    def arealite_close_weight_update(self) -> bool:
        """Finish a streamed update left open (its trainer died between `/start_weight_update` and
        `/finish_weight_update`), so the model is whole and the next start is accepted; the weights
        stay partly updated until that update. Returns whether one was open."""
        if not getattr(self, "_weight_update_active", False):
            return False
        self.finish_weight_update()  # the weight version is left as it was
        return True

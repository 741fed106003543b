"""Training-health monitor the loop can call after backward: per-layer gradient norms with a spike detector
(MoCo v3 Fig. 4: instability shows first as sudden spikes of the first layer's gradient norm). Non-finite losses
are caught by the loop itself (scale/loop/train.py, all-reduced over ranks before any update)."""

from collections import deque

import torch
from torch import nn


def layer_name(param_name: str) -> str:
    """Group parameters by layer: up to the first block index ('backbone.blocks.3.attn.qkv.weight' ->
    'backbone.blocks.3'), else the owning module ('backbone.patch_embed.proj.weight' -> 'backbone.patch_embed.proj').
    Wrapper prefixes (DDP 'module.', FSDP/compile internals) are dropped."""
    parts = [
        p
        for p in param_name.split(".")
        if p not in ("module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
    ]
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or parts[-1]


@torch.no_grad()
def layer_grad_norms(module: nn.Module) -> dict[str, float]:
    """L2 norm of the gradient of each layer. Under FSDP2 the gradients are DTensors and the norm is a collective:
    every rank must call this at the same point."""
    squares: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters():
        if param.grad is None:
            continue
        sq = torch.linalg.vector_norm(param.grad.float()) ** 2
        if hasattr(sq, "full_tensor"):
            sq = sq.full_tensor()
        layer = layer_name(name)
        squares[layer] = squares[layer] + sq if layer in squares else sq
    return {layer: float(sq.sqrt()) for layer, sq in squares.items()}


class GradSpikeDetector:
    """Flags a layer whose gradient norm exceeds `ratio` times its mean over the last `window` steps (after
    `min_history` steps of history)."""

    def __init__(self, ratio: float = 5.0, window: int = 100, min_history: int = 20):
        self.ratio, self.window, self.min_history = ratio, window, min_history
        self.history: dict[str, deque] = {}

    def update(self, norms: dict[str, float]) -> list[str]:
        spikes = []
        for layer, value in norms.items():
            past = self.history.setdefault(layer, deque(maxlen=self.window))
            if len(past) >= self.min_history and value > self.ratio * (sum(past) / len(past)):
                spikes.append(layer)
            past.append(value)
        return spikes

    def __call__(self, module: nn.Module) -> dict[str, float]:
        """Metrics after backward: the first layer's and the largest layer gradient norm, and the spike count."""
        norms = layer_grad_norms(module)
        if not norms:
            return {}
        spikes = self.update(norms)
        first = next(iter(norms))
        return {
            "grad_norm_first_layer": norms[first],
            "grad_norm_max_layer": max(norms.values()),
            "grad_spikes": float(len(spikes)),
        }

    def state_dict(self) -> dict:
        return {layer: list(values) for layer, values in self.history.items()}

    def load_state_dict(self, state: dict) -> None:
        self.history = {layer: deque(values, maxlen=self.window) for layer, values in state.items()}

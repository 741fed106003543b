"""Parameter and multiply-add counts of a backbone, without running it for real.

A materialised model is traced under FakeTensorMode and a meta-built one on the meta device, so ViT-H or ViT-L/7
cost no memory or compute. Attention runs on the math path while counting: torch's FlopCounterMode has no
formula for the CPU fused attention kernel and would silently drop the attention matmuls.
"""

from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode


def count_params(backbone: nn.Module) -> int:
    """All parameters, trainable or frozen (e.g. MoCo v3's random patch projection)."""
    return sum(p.numel() for p in backbone.parameters())


def count_macs(backbone: nn.Module, img_size: int | tuple[int, int]) -> int:
    """Multiply-adds of one forward of one image of `img_size`, in eval mode, attention matmuls included."""
    return count_forward(backbone, img_size)[0]


def count_forward(backbone: nn.Module, img_size: int | tuple[int, int]) -> tuple[int, dict]:
    """`count_macs` and the output of the forward it counted (its token grid: no second forward to read it)."""
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    device = next(backbone.parameters()).device
    tracing = nullcontext() if device.type == "meta" else FakeTensorMode(allow_non_fake_inputs=True)
    counter = FlopCounterMode(display=False)
    try:
        with _math_attention(backbone), _eval(backbone), torch.no_grad(), tracing:
            image = torch.empty(1, 3, height, width, device=device)
            with counter:
                out = backbone(image)
    finally:
        _clear_caches(backbone)  # size caches built while tracing hold fake tensors
    return counter.get_total_flops() // 2, out


@contextmanager
def _math_attention(module: nn.Module):
    fused = [m for m in module.modules() if getattr(m, "fused_attn", False)]
    for m in fused:
        m.fused_attn = False
    try:
        yield
    finally:
        for m in fused:
            m.fused_attn = True


@contextmanager
def _eval(module: nn.Module):
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _clear_caches(module: nn.Module) -> None:
    for m in module.modules():
        if hasattr(m, "clear_cache"):
            m.clear_cache()

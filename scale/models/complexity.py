"""Parameter and multiply-add counts of a backbone, without running it for real.

A materialised model is traced under FakeTensorMode and a meta-built one on the meta device, so ViT-H or ViT-L/7
cost no memory or compute. Attention runs on the math path while counting: torch's FlopCounterMode has no
formula for the CPU fused attention kernel and would silently drop the attention matmuls.

Tracing runs torch's Python meta kernels, about 0.3 s per ViT-B block: a module that repeats another (the same
structure, given inputs of the same shapes; a ViT's 12-32 blocks, a Swin stage's) is run once per forward and its
count reused (`_repeats_counted_once`), which made `scale models table` 5x faster.
"""

from collections import Counter
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import FlopCounterMode


def count_params(backbone: nn.Module) -> int:
    """All parameters, trainable or frozen (e.g. MoCo v3's random patch projection)."""
    return sum(p.numel() for p in backbone.parameters())


def count_macs(backbone: nn.Module, img_size: int | tuple[int, int]) -> int:
    """Multiply-adds of one forward of one image of `img_size`, in eval mode, attention matmuls included."""
    return count_forward(backbone, img_size)[0]


def count_forward(backbone: nn.Module, img_size: int | tuple[int, int], *, once: bool = True) -> tuple[int, dict]:
    """`count_macs` and the output of the forward it counted (its token grid: no second forward to read it).
    `once`: a repeated module runs once (False: every module runs, the reference tests/models compares with)."""
    height, width = (img_size, img_size) if isinstance(img_size, int) else img_size
    device = next(backbone.parameters()).device
    tracing = nullcontext() if device.type == "meta" else FakeTensorMode(allow_non_fake_inputs=True)
    counter = FlopCounterMode(display=False)
    try:
        with _math_attention(backbone), _eval(backbone), torch.no_grad(), tracing:
            image = torch.empty(1, 3, height, width, device=device)
            with counter, _repeats_counted_once(backbone, counter) if once else nullcontext([0]) as reused:
                out = backbone(image)
    finally:
        _clear_caches(backbone)  # size caches built while tracing hold fake tensors
    return (counter.get_total_flops() + reused[0]) // 2, out


def structure(module: nn.Module, skip: str | None = None) -> tuple:
    """What makes two modules compute the same: their modules and attention heads (which neither a module's repr
    nor a shape shows), and the names and shapes of their parameters and buffers (but those whose name holds
    `skip`)."""
    heads = tuple(m.num_heads for m in module.modules() if isinstance(getattr(m, "num_heads", None), int))
    shapes = [(n, tuple(t.shape)) for n, t in module.named_parameters() if skip is None or skip not in n]
    buffers = [(n, tuple(t.shape)) for n, t in module.named_buffers() if skip is None or skip not in n]
    return repr(module), heads, tuple(shapes), tuple(buffers)


@contextmanager
def _repeats_counted_once(backbone: nn.Module, counter: FlopCounterMode):
    """Modules of `backbone` whose structure repeats run once per input shape: a repeat returns empty tensors of
    the first run's output shapes and adds the first run's count (nested repeats included) to the list it yields.
    Exact where a module's count depends on its structure and its inputs' shapes alone, as for every backbone in
    scale.models (tests/models/test_model_counts.py compares with every module run)."""
    reused = [0]
    memo: dict = {}
    keys = {m: structure(m) for m in backbone.modules() if m is not backbone and "forward" not in vars(m)}
    repeats = Counter(keys.values())
    wrapped = [m for m, key in keys.items() if repeats[key] > 1]

    def once(module: nn.Module, key: tuple):
        run = module.forward

        def forward(*args, **kwargs):
            leaves, spec = pytree.tree_flatten((args, kwargs))
            call = (key, str(spec), tuple(_shape_of(leaf) for leaf in leaves))
            if call in memo:
                count, out = memo[call]
                reused[0] += count
                return pytree.tree_map_only(torch.Tensor, torch.empty_like, out)
            before = counter.get_total_flops() + reused[0]
            out = run(*args, **kwargs)
            memo[call] = counter.get_total_flops() + reused[0] - before, out
            return out

        return forward

    for m in wrapped:
        m.forward = once(m, keys[m])
    try:
        yield reused
    finally:
        for m in wrapped:
            del m.forward


def _shape_of(leaf) -> object:
    return (tuple(leaf.shape), leaf.dtype) if torch.is_tensor(leaf) else repr(leaf)


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

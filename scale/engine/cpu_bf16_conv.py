"""A guard against a CPU bf16 convolution bug: strided, padded convolutions on maps smaller than their stride
compute their weight gradient in fp32.

On CPU (oneDNN, torch 2.14.1), the bf16 weight gradient of a convolution with stride > 1 and padding > 0 leaves
some entries unwritten when the input is smaller than the stride along a side (a ResNet's stride-2 3x3 conv on a
1x1 map, as 16 px crops reach layer4). Those entries hold whatever the memory held before: usually the right
numbers, sometimes garbage up to inf or NaN, so a run diverges at a random step. `tests/engine/test_cpu_bf16_conv.py`
shows it. Such a convolution runs in fp32 (its output cast back to bf16, as autocast would give); every other
convolution, and everything on GPUs, is left alone.
"""

import torch
from torch import nn


def hits_cpu_bf16_bug(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Stride > 1, padding > 0 and an input side shorter than its stride, in bf16 on CPU (a superset of the
    shapes seen to go wrong; the fp32 detour is cheap at these sizes)."""
    if x.device.type != "cpu" or isinstance(conv.padding, str):  # 'same' needs stride 1; 'valid' pads nothing
        return False
    if (
        not (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
        and weight.dtype != torch.bfloat16
    ):
        return False
    return any(
        stride > 1 and pad > 0 and size < stride for size, stride, pad in zip(x.shape[-2:], conv.stride, conv.padding)
    )


class CpuSafeConv2d(nn.Conv2d):
    """nn.Conv2d with the fp32 detour; swapped in as the class of existing modules (parameters unchanged)."""

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not hits_cpu_bf16_bug(self, x, weight):
            return super()._conv_forward(x, weight, bias)
        with torch.autocast("cpu", enabled=False):
            out = super()._conv_forward(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(torch.bfloat16)


def guard_cpu_bf16_convs(module: nn.Module) -> int:
    """Give every plain nn.Conv2d in `module` the fp32 detour, in place; returns how many. Call it for bf16 runs on
    CPU, before wrapping (FSDP2 and checkpointing wrap the class they find)."""
    convs = [m for m in module.modules() if type(m) is nn.Conv2d]
    for conv in convs:
        conv.__class__ = CpuSafeConv2d
    return len(convs)

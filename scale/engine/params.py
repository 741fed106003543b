"""Parameter names and local tensors seen through any wrapper.

Names are the unwrapped student names ('head.last_layer.weight_v'): DDP's 'module.', torch's checkpoint and FSDP1
wrapper prefixes and torch.compile's '_orig_mod.' are removed. Local tensors are what this rank holds: the shard of
an FSDP2 DTensor, or the whole tensor otherwise.
"""

import torch
from torch import nn
from torch.distributed.tensor import DTensor

WRAPPER_PREFIXES = ("module.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    parts = [p for p in name.split(".") if p + "." not in WRAPPER_PREFIXES]
    return ".".join(parts)


def named_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(clean_name(n), p) for n, p in module.named_parameters()]


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def nbytes(tensor: torch.Tensor) -> int:
    t = local(tensor)
    return t.numel() * t.element_size()

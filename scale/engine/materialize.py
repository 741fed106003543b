"""Meta-device initialisation: a model built on the 'meta' device is allocated only after sharding, then
initialised in place (each rank allocates and fills just its shards).

Initialisation calls every submodule's `reset_parameters()` (torch layers), then `init_weights()` of the outermost
submodules that define it (scale's backbones: the paper's init, see `scale.models.init_weights`). Tensors are first
filled with a sentinel, so that any parameter or buffer the initialiser missed (e.g. a cls_token owned by a module
without `reset_parameters`) fails loudly, by name.
"""

from collections.abc import Callable

import torch
from torch import nn

from scale.engine.params import clean_name, local


def is_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in list(module.parameters()) + list(module.buffers()))


def outermost_with(module: nn.Module, method: str) -> list[nn.Module]:
    """Submodules defining `method` that are not inside another such submodule."""
    found: list[nn.Module] = []
    for sub in module.modules():
        if callable(getattr(sub, method, None)) and not any(sub in outer.modules() for outer in found):
            found.append(sub)
    return found


def default_init(module: nn.Module) -> None:
    for sub in module.modules():
        if callable(getattr(sub, "reset_parameters", None)):
            sub.reset_parameters()
    for sub in outermost_with(module, "init_weights"):
        sub.init_weights()


def _sentinel(t: torch.Tensor) -> float | int | None:
    if t.is_floating_point():
        return float("nan")
    if t.dtype != torch.bool and not t.is_complex():
        return torch.iinfo(t.dtype).min
    return None


def _named_tensors(module: nn.Module):
    yield from module.named_parameters()
    yield from module.named_buffers()


@torch.no_grad()
def materialize(module: nn.Module, device: torch.device, init: Callable[[nn.Module], None] | None = None) -> None:
    module.to_empty(device=device)
    for _, t in _named_tensors(module):
        value = _sentinel(t)
        if value is not None:
            local(t).fill_(value)
    (init or default_init)(module)
    for name, t in _named_tensors(module):
        value = _sentinel(t)
        if value is None:
            continue
        loc = local(t)
        missed = loc.isnan().any() if t.is_floating_point() else (loc == value).any()
        if missed:
            raise RuntimeError(
                f"meta-device init left '{clean_name(name)}' of {type(module).__name__} "
                f"uninitialised: the model's init function must set every parameter and buffer"
            )

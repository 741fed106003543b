"""Backbones by name: `register(name)` decorates a factory `(model_cfg, drop_path) -> nn.Module`."""

from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import nn

from scale.errors import UserError

_FACTORIES: dict[str, Callable] = {}


def register(name: str) -> Callable:
    def decorate(factory: Callable) -> Callable:
        if name in _FACTORIES:
            raise ValueError(f"backbone '{name}' registered twice")
        _FACTORIES[name] = factory
        return factory

    return decorate


def _loaded() -> dict[str, Callable]:
    """The factories, every family imported (importing this module alone registers none of them)."""
    from scale.models import load_families

    load_families()
    return _FACTORIES


def available() -> list[str]:
    return sorted(_loaded())


def build_backbone(model_cfg, *, drop_path: float | None = None, device: str | torch.device | None = None) -> nn.Module:
    """Build `model_cfg.name`. `drop_path` overrides the recipe (teachers use 0.0); `device="meta"` allocates
    nothing (initialise after materialising with `scale.models.init_weights`)."""
    factory = _loaded().get(model_cfg.name)
    if factory is None:
        raise UserError(f"model.name: unknown backbone '{model_cfg.name}'; available: {', '.join(available())}")
    rate = model_cfg.drop_path if drop_path is None else drop_path
    # the default-device context also covers tensors timm creates without a device argument
    with torch.device(device) if device is not None else nullcontext():
        return factory(model_cfg, drop_path=rate)

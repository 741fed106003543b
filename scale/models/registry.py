"""Backbones by name: `register(name)` decorates a factory `(model_cfg, drop_path) -> nn.Module`; the names are those
scale.models.BACKBONES declares, each registered by the family module it names there."""

import importlib
from collections.abc import Callable
from contextlib import nullcontext

import torch
from torch import nn

from scale.errors import UserError
from scale.extras import import_timm
from scale.models import BACKBONES, available

_FACTORIES: dict[str, Callable] = {}


def register(name: str) -> Callable:
    if name not in BACKBONES:
        raise ValueError(f"backbone '{name}' is not declared in scale/models/__init__.py BACKBONES")

    def decorate(factory: Callable) -> Callable:
        if name in _FACTORIES:
            raise ValueError(f"backbone '{name}' registered twice")
        _FACTORIES[name] = factory
        return factory

    return decorate


def factory_of(name: str) -> Callable:
    """The factory of backbone `name`, its family imported (importing this module alone registers none)."""
    if name not in BACKBONES:
        raise UserError(f"model.name: unknown backbone '{name}'; available: {', '.join(available())}")
    import_timm()  # without wandb
    importlib.import_module(f"scale.models.{BACKBONES[name]}")
    return _FACTORIES[name]


def build_backbone(model_cfg, *, drop_path: float | None = None, device: str | torch.device | None = None) -> nn.Module:
    """Build `model_cfg.name`. `drop_path` overrides the recipe (teachers use 0.0); `device="meta"` allocates
    nothing (initialise after materialising with `scale.models.init_weights`)."""
    factory = factory_of(model_cfg.name)
    rate = model_cfg.drop_path if drop_path is None else drop_path
    # the default-device context also covers tensors timm creates without a device argument
    with torch.device(device) if device is not None else nullcontext():
        return factory(model_cfg, drop_path=rate)

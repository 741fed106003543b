"""Backbones by name: `register(name)` decorates a factory `(model_cfg, drop_path) -> nn.Module`; the names are those
scale.models.BACKBONES declares, each registered by the family module it names there."""

import contextlib
import importlib
from collections.abc import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

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
    with building_on(device):
        return factory(model_cfg, drop_path=rate)


# In-place ops that only set values: what weight initialisation calls. The torch.nn.init functions are listed
# themselves: a mode does not see the ops they call (a mode is off while it runs a function it let through).
VALUE_SETTERS = frozenset(
    f"{name}_"
    for name in (
        "uniform normal trunc_normal erfinv clamp clamp_min clamp_max mul add sub div fill zero copy exponential "
        "bernoulli random log_normal geometric cauchy pow sqrt abs neg exp log "
        "constant ones zeros eye dirac xavier_uniform xavier_normal kaiming_uniform kaiming_normal orthogonal sparse"
    ).split()
)


class _NoValuesOnMeta(TorchFunctionMode):
    """A meta tensor has no values: initialising it is a no-op. Skipped, because meta kernels of these ops run as
    Python decompositions (torch._refs): timm's trunc_normal_ alone was 40% of building every recipe's model on the
    meta device (`scale recipes check`, `scale models table`, meta_init)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes its tensor by keyword
        if getattr(func, "__name__", "") in VALUE_SETTERS and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


@contextlib.contextmanager
def building_on(device: str | torch.device | None):
    """Modules built inside are created on `device` (the default-device context, which also covers tensors timm
    creates without a device argument); on "meta", their initialisation is skipped (_NoValuesOnMeta)."""
    if device is None:
        yield
        return
    with torch.device(device), _NoValuesOnMeta() if torch.device(device).type == "meta" else contextlib.nullcontext():
        yield

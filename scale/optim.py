"""Optimizers and parameter groups.

Parameter groups follow DINO's `get_params_groups`: biases and 1-D parameters (norms, BatchNorm) get no weight
decay when `optim.wd_exclude_1d`; everything else (including cls_token and pos_embed) is decayed. Each group carries
a `wd_scale` tag, so that `apply_schedule` can set the learning rate and weight decay of the current global step on
any optimizer, including DeepSpeed's, whose groups keep these keys. The schedules themselves (and the lr scaling
rule) are in scale/schedules.py.
"""

import importlib.util
from collections.abc import Iterable

import torch

from scale.errors import UserError

OPTIMIZERS = ("adamw", "lars", "lamb", "sgd")


def is_no_decay(name: str, param: torch.Tensor) -> bool:
    return name.endswith(".bias") or param.ndim <= 1


def param_groups(named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg) -> list[dict]:
    """Trainable parameters split into a decayed group and a group without weight decay (empty groups dropped)."""
    decay, no_decay = [], []
    for name, param in named_params:
        if not param.requires_grad:
            continue
        (no_decay if cfg.wd_exclude_1d and is_no_decay(name, param) else decay).append(param)
    groups = [
        {"params": decay, "group": "decay", "wd_scale": 1.0},
        {"params": no_decay, "group": "no_decay", "wd_scale": 0.0},
    ]
    return [g for g in groups if g["params"]]


def apply_schedule(groups: list[dict], lr: float, weight_decay: float) -> None:
    """Set this step's learning rate and weight decay on every group (called by the loop before each step)."""
    for group in groups:
        group["lr"] = lr
        group["weight_decay"] = weight_decay * group.get("wd_scale", 1.0)


# what a group holds that comes from the checkpoint on resume: its parameters, and timm LAMB's step count
LOADED_GROUP_KEYS = ("params", "step")


def settings(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each group's settings as the recipe made them, to put back after a checkpoint load (`keep_settings`)."""
    return [{k: v for k, v in group.items() if k not in LOADED_GROUP_KEYS} for group in optimizer.param_groups]


def keep_settings(optimizer: torch.optim.Optimizer, recipe: list[dict]) -> None:
    """The recipe's group settings (`settings` before the load) over the saved ones a load copied in: the optim
    fields (betas, eps, momentum...) may change on resume. torch's load_state_dict puts new group dicts in place,
    so this writes into the optimizer's groups as they are after the load."""
    for group, kept in zip(optimizer.param_groups, recipe):
        loaded = {k: group[k] for k in LOADED_GROUP_KEYS if k in group}
        group.clear()
        group.update(kept, **loaded)
    place_steps(optimizer)


def place_steps(optimizer: torch.optim.Optimizer) -> None:
    """torch's rule for where a parameter's `step` lives (Optimizer._process_value_according_to_param_policy): on
    the parameter's device, fp32, in a fused or capturable group; as loaded otherwise. A load applies it with the
    saved groups' flags, so a checkpoint saved on a CPU (AdamW not fused) and resumed on a GPU (fused) kept its
    steps on the CPU, and fused AdamW refused them (DeepSpeed ZeRO-1 and ZeRO-3, H200, 2026-11-28). A state whose
    parameter no group lists (DeepSpeed ZeRO-3 puts each flat partition in its group only for its own step) follows
    the groups' flag. Runs on a load only: a loop over the parameters is no step's cost."""
    on_device = {
        id(p): bool(g.get("fused") or g.get("capturable")) for g in optimizer.param_groups for p in g["params"]
    }
    unlisted = any(g.get("fused") or g.get("capturable") for g in optimizer.param_groups)
    for param, state in optimizer.state.items():
        step = state.get("step")
        if torch.is_tensor(step) and on_device.get(id(param), unlisted) and step.device != param.device:
            state["step"] = step.to(dtype=torch.float32, device=param.device)


def apex_available() -> bool:
    # `pip install apex` installs an unrelated web toolkit: look for NVIDIA apex's optimizers, not the name
    try:
        return importlib.util.find_spec("apex.optimizers") is not None
    except ModuleNotFoundError:
        return False


def build_optimizer(
    groups: list[dict], cfg, device: torch.device, sharded: bool = False, fused: bool | None = None
) -> torch.optim.Optimizer:
    """AdamW (fused on CUDA, or when `fused`), LARS and LAMB (timm), or SGD with momentum (fused when `fused`).
    apex's FusedLAMB replaces timm's LAMB on CUDA when apex is installed and parameters are whole tensors (not
    DTensor shards). Fused torch optimizers skip their update on the device when the non-finite guard's flag is
    set (scale.engine.guard); DDP and FSDP2 ask for them on every device."""
    cuda = device.type == "cuda"
    fused_adamw = fused or cuda or None
    betas = tuple(cfg.betas)
    if len(betas) != 2:
        raise UserError(f"optim.betas must have 2 values, got {list(cfg.betas)}")
    if cfg.name == "adamw":
        return torch.optim.AdamW(
            groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, fused=fused_adamw
        )
    if cfg.name == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, fused=fused)
    if cfg.name == "lars":
        from timm.optim import Lars  # timm's optimizers cost seconds to import: only for the recipes that use them

        # timm's LARS skips the trust ratio where weight decay is 0, i.e. on the no-decay group, as DINO's LARS does
        return Lars(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cuda and not sharded and apex_available():
        from apex.optimizers import FusedLAMB

        # the engine clips (per-parameter or global), so LAMB's own global clipping is switched off (FusedLAMB
        # divides by max_grad_norm: 0 would zero the update, infinity never clips)
        return FusedLAMB(
            groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, max_grad_norm=float("inf")
        )
    from timm.optim import Lamb

    return Lamb(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, max_grad_norm=None)


@torch.no_grad()
def init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the state of every trainable parameter that has none yet, exactly as its first real step would
    (zero moments, step count 0). Checkpoints then hold the same keys whether or not some parameters were frozen
    so far (DINO's last layer in epoch 0), and the optimizer's memory is allocated up front.

    Done by one step with zero gradients on those parameters only, lr 0 and weight decay 0, after which the step
    counters it advanced (per parameter, or per group as in timm's LAMB) are put back."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    missing = [p for p in params if p.requires_grad and not optimizer.state.get(p)]
    if not missing:
        return
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    for p in missing:
        p.grad = torch.zeros_like(p)
    saved = [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in g.items() if k != "params"}
        for g in optimizer.param_groups
    ]
    for g in optimizer.param_groups:  # no move, and no coupled weight decay leaking into momentum buffers
        g["lr"] = 0.0
        g["weight_decay"] = 0.0
    optimizer.step()
    for g, before in zip(optimizer.param_groups, saved):
        g.pop("step", None)
        g.update(before)
    for p in missing:
        state = optimizer.state[p]
        if torch.is_tensor(state.get("step")):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0
    for p, grad in zip(params, grads):
        p.grad = grad

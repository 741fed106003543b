"""The backbone an evaluation runs: built from the recipe's `model` section, with exported weights or at random init."""

import logging
from pathlib import Path

import torch
import torch.nn as nn

from scale.errors import UserError
from scale.models import build_backbone

log = logging.getLogger(__name__)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The backbone state dict of a weights file in any layout scale reads (scale/checkpoint/layouts.py: exports,
    timm, official DINO/EsViT/MoCo v3/DRLoc/DINOv2 checkpoints; the teacher's where it has both); no code runs."""
    from scale.checkpoint.layouts import backbone_of, read_source

    try:
        source = read_source(path)
    except UserError as err:
        raise UserError(f"--weights {err}") from None
    whose, state = backbone_of(source)
    log.info("--weights %s: %s backbone of a %s (%d tensors)", path, whose, source.layout, len(state))
    return state


def mismatch(wanted, found) -> str:
    """'' when the names agree, else which are missing and which unexpected (the first five of each)."""
    missing, unexpected = sorted(set(wanted) - set(found)), sorted(set(found) - set(wanted))
    return f"missing {missing[:5]}, unexpected {unexpected[:5]}" if missing or unexpected else ""


def load_backbone(
    model_cfg, weights: str | Path | None, device: torch.device, drop_path: float = 0.0, frozen: bool = True
) -> nn.Module:
    """The backbone with exported weights (strict), or at random init when None; `frozen`: in eval mode without
    gradients (every evaluation but fine-tuning)."""
    backbone = build_backbone(model_cfg, drop_path=drop_path, device=device)
    if weights is None:
        log.info("evaluating %s at random initialisation (no --weights)", model_cfg.name)
    else:
        state = read_state_dict(weights)
        problem = mismatch(backbone.state_dict().keys(), state.keys())
        if problem:
            raise UserError(f"--weights {weights} does not match model '{model_cfg.name}': {problem}")
        try:
            backbone.load_state_dict(state, strict=True)
        except RuntimeError as err:  # shape mismatches
            raise UserError(f"--weights {weights} does not fit model '{model_cfg.name}': {err}") from None
    if frozen:
        backbone.requires_grad_(False)
        backbone.eval()
    return backbone

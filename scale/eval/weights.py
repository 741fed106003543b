"""The backbone an evaluation runs: built from the recipe's `model` section, with exported weights or at random init."""

import logging
from pathlib import Path

import torch
import torch.nn as nn

from scale.errors import UserError
from scale.models import build_backbone

log = logging.getLogger(__name__)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from a .safetensors file or a torch file (loaded with weights_only: no code runs)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--weights: file not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors and torch raise many types for a bad file
        raise UserError(f"--weights {path}: cannot read weights ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise UserError(
            f"--weights {path}: expected a backbone state dict (name -> tensor), as `scale ckpt export` writes"
        )
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

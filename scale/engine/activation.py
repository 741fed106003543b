"""Activation checkpointing on the backbones' transformer blocks: none, full (every block) or every N-th block.

torch's composable non-reentrant `checkpoint` keeps parameter names unchanged and composes with DDP, FSDP2 and
DeepSpeed; being non-reentrant it supports several forwards of the same blocks per step (multi-crop).
"""

from torch import nn
from torch.distributed._composable import checkpoint

from scale.errors import UserError

MODES = ("none", "full", "every_n")


def blocks_to_checkpoint(model: nn.Module, mode: str, every_n: int) -> list[nn.Module]:
    if mode not in MODES:
        raise UserError(f"engine.activation_checkpointing='{mode}' is not one of {', '.join(MODES)}")
    if mode == "none":
        return []
    if mode == "every_n" and every_n < 1:
        raise UserError(f"engine.ac_every_n must be >= 1, got {every_n}")
    chosen = []
    for part in model.children():
        if hasattr(part, "block_modules"):
            blocks = list(part.block_modules())
            chosen += blocks if mode == "full" else blocks[::every_n]
    if not chosen:
        raise UserError(
            f"engine.activation_checkpointing={mode} needs a backbone with block_modules(); "
            f"{type(model).__name__} has none among its parts"
        )
    return chosen


def apply_activation_checkpointing(model: nn.Module, mode: str, every_n: int) -> int:
    """Checkpoint the chosen blocks in place; returns how many."""
    blocks = blocks_to_checkpoint(model, mode, every_n)
    for block in blocks:
        checkpoint(block)
    return len(blocks)

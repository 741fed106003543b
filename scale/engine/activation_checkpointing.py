"""Activation checkpointing on the backbones' transformer blocks: none, full (every block), every N-th block, or
selective (every block, op by op: torch's selective checkpointing with a policy in the manner of torchtitan's).

Selective keeps the outputs of the fused attention kernels and of the matmuls whose output is no wider than their
input (a ViT block's attention projection and MLP fc2: D values per token each), and recomputes the widening
matmuls (qkv: 3D, MLP fc1: 4D) with everything cheap (norms, GELU, dropout, drop path, residual adds). torchtitan
keeps all matmuls but every second one; chosen by width instead, the recomputed ones are those with the largest
outputs. DINO ViT-B/16, 2x224 crops, fp32 on the CPU (README, `scale bench ac`): 60 MiB of activations per image
instead of 226 without checkpointing (3.8x less) for 1.10x the step's CPU time; keeping every matmul holds 157 MiB
(1.4x less), torchtitan's alternation, which here keeps qkv and fc1, 129 MiB (1.75x).

A checkpointed block's `forward` runs inside torch's non-reentrant `checkpoint` (set on the instance, so parameter
names are unchanged). Being a function of the forward rather than module hooks, it composes with DDP, FSDP2 and
DeepSpeed (their hooks stay around the block's call), with several forwards of the same blocks per step
(multi-crop), and with engine.compile: the checkpoint is traced inside the compiled block, where the compiler's
partitioner recomputes what the policy says (scale/engine/compile.py).

Selective checkpointing runs with autocast's cache of weight casts off. With it on, a block called a second time in
one autocast region (DINO's local crops after its global ones) reuses the first call's cast of each weight and skips
the cast op, which that call's recompute then makes: selective checkpointing counts every op of the forward and
refuses the backward (pytorch/pytorch#193338, open). Uncached, each call and its recompute cast alike (the checkpoint
records the cache setting for its recompute). It costs a cast per weight per call instead of per region where the
weights are left to autocast; the DDP engine's bf16 student (scale/engine/lowp.py) holds them cast already.
"""

import contextlib

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from scale.errors import UserError

MODES = ("none", "full", "every_n", "selective")

_ATEN = torch.ops.aten
MATMULS = {_ATEN.mm.default, _ATEN.addmm.default, _ATEN.bmm.default}
# the fused attention kernels of CPU and CUDA: their outputs (and log-sum-exp) are what their backward needs
ATTENTION = {
    _ATEN._scaled_dot_product_flash_attention.default,
    _ATEN._scaled_dot_product_efficient_attention.default,
    _ATEN._scaled_dot_product_cudnn_attention.default,
    _ATEN._scaled_dot_product_flash_attention_for_cpu.default,
}


def widens(op, args) -> bool:
    """Whether a matmul's output rows are wider than its input rows (ViT's qkv: D -> 3D, MLP fc1: D -> 4D)."""
    left, right = (args[1], args[2]) if op == _ATEN.addmm.default else (args[0], args[1])
    return right.shape[-1] > left.shape[-1]


def _keep_narrow_outputs(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op in ATTENTION or (op in MATMULS and not widens(op, args)):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    return create_selective_checkpoint_contexts(_keep_narrow_outputs)


def part_blocks(part: nn.Module) -> list[nn.Module]:
    """The transformer blocks of one part of a method's net (its backbone's block_modules()); none for a head."""
    return list(part.block_modules()) if hasattr(part, "block_modules") else []


def blocks_to_checkpoint(model: nn.Module, mode: str, every_n: int) -> list[nn.Module]:
    """`mode` and `every_n` as the recipe checks them (engine.activation_checkpointing, engine.ac_every_n)."""
    if mode == "none":
        return []
    chosen = []
    for part in model.children():
        blocks = part_blocks(part)
        chosen += blocks[::every_n] if mode == "every_n" else blocks
    if not chosen:
        raise UserError(
            f"engine.activation_checkpointing={mode} needs a backbone with block_modules(); "
            f"{type(model).__name__} has none among its parts"
        )
    return chosen


class Checkpointed:
    """A block's forward run under non-reentrant checkpointing. It holds the forward as a bound method, so that a
    deep copy of the block calls the copy's own forward."""

    def __init__(self, forward, selective: bool):
        self.forward, self.selective = forward, selective

    def __call__(self, *args, **kwargs):
        if not self.selective:
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        with autocast_cache_off():
            return checkpoint(self.forward, *args, use_reentrant=False, context_fn=selective_context, **kwargs)


@contextlib.contextmanager
def autocast_cache_off():
    """Autocast's cache of weight casts off, for a selectively checkpointed call (module docstring). Traced by the
    compiler, a block has no cache to keep consistent: left as it is."""
    if torch.compiler.is_compiling():
        yield
        return
    cached = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(False)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(cached)


def apply_activation_checkpointing(model: nn.Module, mode: str, every_n: int) -> int:
    """Checkpoint the chosen blocks in place; returns how many."""
    blocks = blocks_to_checkpoint(model, mode, every_n)
    for block in blocks:
        block.forward = Checkpointed(block.forward, selective=mode == "selective")
    return len(blocks)

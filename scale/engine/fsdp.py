"""FSDP2 (`fully_shard`): one unit per transformer block, each part (backbone, head, ...) its own unit, then the
root. The teacher is sharded with the same calls, so its local shards line up with the student's and the EMA is
shard-local; it reshards after every forward, root included (FSDP2 keeps an auto-configured root unsharded after
forward, which would keep a whole gathered teacher alive).

HSDP: with engine.shard_size=S smaller than the world, the parallel context's mesh is 2-D (replicate x shard) and
FSDP2 shards each parameter over the S ranks of a group and replicates it across groups (gradients are
reduce-scattered inside the group, then all-reduced across groups). The teacher gets the same placements, so the EMA
stays a local lerp over matching shards.

Mixed precision: bf16 (or fp16) parameters for compute, fp32 gradient reduction and fp32 sharded master weights;
BatchNorm layers are fp32 units of their own, whose inputs and outputs are cast by hooks of ours (`fp32_inside`).
"""

import warnings
from functools import partial

import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.modules.batchnorm import _BatchNorm

from scale.engine.activation_checkpointing import part_blocks
from scale.engine.ema import copy_student_to_teacher
from scale.engine.materialize import materialize
from scale.engine.torch_engine import TorchEngine
from scale.methods.base import Method

# Backbones return slices (class token, patch tokens) of their last activation, and FSDP2 warns on every forward
# that an in-place op on such a view would skip its backward hook. No method modifies backbone outputs in place
# (they only read them), so the warning says nothing here but floods every rank's log.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


def has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def to_fp32(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def to_dtype(dtype: torch.dtype, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return output.to(dtype)


def fp32_inside(module: nn.Module, compute_dtype: torch.dtype) -> None:
    """Inputs cast to fp32 before the module and its output back to the compute dtype, by plain module hooks.
    Not FSDP2's cast_forward_inputs/output_dtype: with those, a BatchNorm inside a checkpointed block (ViT-BN)
    saw fp32 inputs in the forward and bf16 ones in the recomputation on an H100 (torch 2.11), which checkpointing
    refuses; plain module hooks run in both passes."""
    module.register_forward_pre_hook(to_fp32)
    module.register_forward_hook(partial(to_dtype, compute_dtype))


class ShardedScaler(ShardedGradScaler):
    """torch's ShardedGradScaler with the inf flag in the shape fused Adam/AdamW take. ShardedGradScaler keeps it
    in shape [1], GradScaler in shape []; the fused optimizers subtract it in place from their 0-d step counts, which
    fails for [1] (pytorch/pytorch#140514: every fp16 FSDP2 step on an H100, torch 2.11)."""

    def unscale_(self, optimizer) -> None:
        super().unscale_(optimizer)
        state = self._per_optimizer_states[id(optimizer)]
        if "found_inf_per_device" in state:  # absent when the scaler is disabled
            flags = state["found_inf_per_device"]
            state["found_inf_per_device"] = {device: flag.reshape(()) for device, flag in flags.items()}


class FSDPEngine(TorchEngine):
    kind = "fsdp2"
    sharded = True

    def wrap(self, method: Method, meta: bool) -> None:
        mesh = self.dist_info.mesh
        # one group of shards: the 1-D "shard" mesh, exactly plain FSDP; several: HSDP on the 2-D mesh
        self.mesh = mesh["shard"] if self.dist_info.replicas == 1 else mesh
        self.shard(method.student, reshard_after_forward=self.cfg.reshard_after_forward, root_reshard=None)
        if method.teacher is not None:
            self.shard(method.teacher, reshard_after_forward=True, root_reshard=True)
        if meta:
            for module in self.modules():
                materialize(module, self.device)
            if method.teacher is not None:
                copy_student_to_teacher(method.teacher, method.student)

    def mp_policy(self) -> MixedPrecisionPolicy:
        if not self.precision.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.precision.dtype, reduce_dtype=torch.float32)

    def shard(self, model: nn.Module, reshard_after_forward: bool, root_reshard: bool | None) -> None:
        """Bottom-up: BatchNorm (fp32, mixed precision only), blocks, parts, root. root_reshard=None lets FSDP2
        keep the root gathered between forward and backward (the student's backward needs it at once)."""
        policy = self.mp_policy()
        kwargs = dict(mesh=self.mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        if self.precision.mixed:
            for sub in model.modules():
                if isinstance(sub, _BatchNorm) and has_params(sub):
                    # fp32 inside, outputs back in the compute dtype for the next (low-precision) layer
                    bn_policy = MixedPrecisionPolicy(
                        param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False
                    )
                    fully_shard(sub, mesh=self.mesh, reshard_after_forward=reshard_after_forward, mp_policy=bn_policy)
                    fp32_inside(sub, self.precision.dtype)
        for part in model.children():
            for block in part_blocks(part):
                fully_shard(block, **kwargs)
            if has_params(part):
                fully_shard(part, **kwargs)
        fully_shard(model, mesh=self.mesh, reshard_after_forward=root_reshard, mp_policy=policy)

    def set_gradient_sync(self, enabled: bool) -> None:
        self.method.student.set_requires_gradient_sync(enabled)

    def make_scaler(self):
        return ShardedScaler(self.device.type, init_scale=2.0**self.cfg.loss_scale_power)

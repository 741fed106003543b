"""`parallelize`: the one path by which every engine (DDP, FSDP2, DeepSpeed) prepares a method's modules, in the
order the large-scale trainers use (torchtitan, DINOv3):

1. module conversions (scale.engine.convert): BatchNorm -> SyncBatchNorm across GPUs, the CPU bf16 conv guard;
2. activation checkpointing of the student's transformer blocks (scale.engine.activation);
3. the wrap, the engine's own call: DDP, FSDP2's `fully_shard` per block, part and root, or `deepspeed.initialize`.

Conversions come first because they replace modules that the later steps hold on to; checkpointing wraps each
block's forward before the wrap, so that FSDP2 gathers a block's parameters again for its recomputation and DDP
sees one module tree.
"""

from collections.abc import Callable

from scale.engine.activation import apply_activation_checkpointing
from scale.engine.convert import convert_modules
from scale.engine.parallel import ParallelContext
from scale.engine.precision import Precision
from scale.methods.base import Method


def parallelize(
    method: Method, engine_cfg, precision: Precision, parallel: ParallelContext, wrap: Callable[[], None]
) -> None:
    convert_modules(method, engine_cfg, precision, parallel)
    apply_activation_checkpointing(method.student, engine_cfg.activation_checkpointing, engine_cfg.ac_every_n)
    wrap()

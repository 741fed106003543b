"""`parallelize`: the one path by which every engine (DDP, FSDP2, DeepSpeed) prepares a method's modules, in the
order the large-scale trainers use (torchtitan, DINOv3):

1. module conversions (scale.engine.convert): BatchNorm -> SyncBatchNorm across GPUs, the CPU bf16 conv guard;
2. activation checkpointing of the student's transformer blocks (scale.engine.activation_checkpointing);
3. torch.compile of each block and head of the student and teacher, when engine.compile (scale.engine.compile);
4. the wrap, the engine's own call: DDP, FSDP2's `fully_shard` per block, part and root, or `deepspeed.initialize`.

Conversions come first because they replace modules that the later steps hold on to; checkpointing wraps each
block's forward before it is compiled, so that the checkpoint is traced into the block's graph; compiling before
the wrap keeps the wrap's hooks (FSDP2 gathers a block's parameters, also again for its recomputation) outside
the compiled forward, and DDP sees one module tree.
"""

from collections.abc import Callable

from scale.engine.activation_checkpointing import apply_activation_checkpointing
from scale.engine.compile import apply_compile
from scale.engine.convert import convert_modules
from scale.engine.parallel import ParallelContext
from scale.engine.precision import Precision
from scale.methods.base import Method


def parallelize(
    method: Method, engine_cfg, precision: Precision, parallel: ParallelContext, wrap: Callable[[], None]
) -> None:
    convert_modules(method, engine_cfg, precision, parallel)
    apply_activation_checkpointing(method.student, engine_cfg.activation_checkpointing, engine_cfg.ac_every_n)
    apply_compile(
        method, engine_cfg.compile, engine_cfg.compile_backend, engine_cfg.compile_mode, engine_cfg.compile_scope
    )
    wrap()

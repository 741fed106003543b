"""engine.compile: `torch.compile` per transformer block and per head of the student and the teacher, as
torchtitan and DINOv3 compile (one graph per block, not the whole model).

- What is compiled is each block's (and head's) `forward`, replaced on the instance: parameter names and state
  dict keys are unchanged, so checkpoints load whether compile is on or off. The engine's wrap comes after and its
  hooks (FSDP2's all-gather and reshard) run eagerly around the compiled forward; a checkpointed block's forward
  (scale/engine/activation_checkpointing.py) is traced with its checkpoint inside. DeepSpeed ZeRO-3 hooks every layer inside a
  block, which dynamo cannot trace: the recipe check refuses that pair (scale/config/validate.py).
- Static shapes (`dynamic=False`): each crop resolution (2 global + N local crops: one batch shape per group) gets
  its own specialised graph in the first step, and later steps reuse them, with no recompilation.
- Blocks are compiled with `fullgraph=True` (every backbone's blocks trace without a graph break: tested), so a
  break is an error, not a silent slowdown. Heads, and blocks that hold a BatchNorm (ViT-BN, ResNet), may hold
  engine units of their own (FSDP2 makes each BatchNorm an fp32 unit under mixed precision) whose hooks run
  eagerly, so they may break: under FSDP2 with bf16 a ViT-BN block runs eagerly (seen on an H100).
- A checkpointed block that holds a BatchNorm is not compiled: traced with its checkpoint inside, its backward saved
  the running statistics that the next crop's forward updates in place, and failed ("modified by an inplace
  operation"; MoCo v3's ViT-BN with two crops, CvT, ResNet). engine.compile_scope=net compiles each net whole
  instead, where such blocks trace with the rest and train as eager does (MoCo v3's ViT-BN under full
  checkpointing: tests/loop/test_step_sync.py).
"""

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from scale.engine import torch_compat
from scale.engine.activation_checkpointing import Checkpointed, part_blocks
from scale.methods.base import Method

# Dynamo keeps the graphs of one function's code together, whichever module calls it, and by default gives up
# (fullgraph: fails) after 8 of them. Identical blocks share a graph, but crop resolution and grad mode (student or
# no-grad teacher) specialise it, and so do a block's stochastic-depth rate where the block draws its own mask (a ViT
# passes its blocks masks drawn for the pass: one graph for all rates). ViT-H/14 with three crop sizes and other
# backbones' per-block rates can still need about 100. Dynamo's cap over all regions of one function
# (accumulated_recompile_limit) is 256.
RECOMPILE_LIMIT = 256


# torch.compile's modes that replay CUDA graphs (inductor's CUDA graph trees)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def replays_cuda_graphs(engine_cfg) -> bool:
    return bool(engine_cfg.compile) and engine_cfg.compile_mode in CUDA_GRAPH_MODES


def begin_graph_step() -> None:
    """One generation of CUDA graph trees per training step (and per validation batch), called at its start where
    `replays_cuda_graphs`. Left to themselves, the trees start a generation at each call of a compiled function
    made with no backward pending, and may then overwrite the previous generation's outputs: the teacher's blocks,
    run under no_grad one after another, read their predecessor's overwritten output, and DINO ViT-S/16 failed in
    its first recorded step ("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run",
    H200, 2026-11-28). Marked, every output of the step stays valid until the next step begins."""
    torch.compiler.cudagraph_mark_step_begin()


def compile_forward(module: nn.Module, backend: str, fullgraph: bool, mode: str = "default") -> None:
    """`mode`: engine.compile_mode, passed only when not the default (the other backends take none)."""
    modes = {} if mode == "default" else {"mode": mode}
    module.forward = torch_compat.compile_fn(
        module.forward, backend=backend, fullgraph=fullgraph, dynamic=False, recompile_limit=RECOMPILE_LIMIT, **modes
    )


def holds_batchnorm(module: nn.Module) -> bool:
    return any(isinstance(sub, _BatchNorm) for sub in module.modules())


def compile_net(net: nn.Module, backend: str, mode: str = "default", scope: str = "blocks") -> int:
    """Compile every block of the net's parts (but a checkpointed one holding a BatchNorm: module docstring) and
    every part without blocks that holds parameters (the heads); returns how many modules. `scope` "net"
    (engine.compile_scope): the net's whole forward instead, every crop group, backbone and head in one graph per
    call shape, with graph breaks allowed (an engine's hooks inside it run eagerly)."""
    if scope == "net":
        compile_forward(net, backend, fullgraph=False, mode=mode)
        return 1
    count = 0
    for part in net.children():
        blocks = part_blocks(part)
        for block in blocks:
            batchnorm = holds_batchnorm(block)
            if not (batchnorm and isinstance(block.forward, Checkpointed)):
                compile_forward(block, backend, fullgraph=not batchnorm, mode=mode)
                count += 1
        if not blocks and any(True for _ in part.parameters()):  # a head
            compile_forward(part, backend, fullgraph=False, mode=mode)
            count += 1
    return count


def apply_compile(method: Method, enabled: bool, backend: str, mode: str = "default", scope: str = "blocks") -> int:
    """Compile the student's and the teacher's blocks and heads (or whole forwards: `scope` "net") in place when
    `enabled`; returns how many modules."""
    if not enabled:
        return 0
    return sum(compile_net(net, backend, mode, scope) for net in (method.student, method.teacher) if net is not None)

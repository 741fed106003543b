"""What one training step of a recipe computes and keeps, counted on fake tensors: no memory, no compute, so
ViT-L/7 or ViT-H cost nothing.

The training step itself (scale.loop.step.TrainStep: the method's own `loss`, backward, the guard) runs for real on a tiny
batch (2 images of the recipe's crop layout), with an engine (`TracingEngine`) that replaces the student and teacher
by stand-ins: each call runs the real net on fake CPU tensors (FakeTensorMode, the kernels
training would pick, e.g. the CPU fused attention) and returns random real tensors of the net's output shapes, so
the loss arithmetic (cross-entropies over 65536 prototypes, EsViT's per-token region loss) is measured too. Counted:
- FLOPs of every student and teacher forward (math attention path: torch's FlopCounterMode has no formula for the
  fused CPU kernel), per transformer-block call as well;
- bytes saved for backward (saved-tensor hooks, each storage once, parameters excluded), per block call, plus
  each block call's input (what non-reentrant activation checkpointing keeps instead), and by the loss; autocast's
  casts of the parameters apart (they do not grow with the batch).
"""

import contextlib

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode

from scale.bench.steptrace import TRACE_IMAGES, BlockCall, StepTrace, trace_config
from scale.data.synthetic import SyntheticLoader
from scale.engine.activation_checkpointing import part_blocks
from scale.engine.base import MEMORY_KEYS, Engine
from scale.engine.lowp import cast_parameters
from scale.engine.parallel import ParallelContext
from scale.engine.params import named_parameters
from scale.models.complexity import _math_attention
from scale.optim import build_optimizer, param_groups

CPU = torch.device("cpu")


def block_modules(net: nn.Module) -> list[nn.Module]:
    """The transformer blocks of the net's parts (what the engines checkpoint and shard)."""
    return [block for part in net.children() for block in part_blocks(part)]


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


# autograd nodes between a parameter and autocast's cast of it as an op saves it (linear saves the weight transposed)
_CAST_OR_VIEW = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0"}


def cast_of_parameter(t: torch.Tensor) -> bool:
    """Whether `t` is a cast of a parameter (or a view of one): its history, one node at a time, reaches a leaf
    through casts and views only, at least one cast."""
    node, cast = t.grad_fn, False
    while node is not None and type(node).__name__ in _CAST_OR_VIEW and len(node.next_functions) == 1:
        cast |= type(node).__name__ == "ToCopyBackward0"
        node = node.next_functions[0][0]
    return cast and node is not None and type(node).__name__ == "AccumulateGrad"


class _Saved:
    """Saved-tensor hook counting each storage once (parameters excluded); `current` is the block call being run.
    Casts of parameters go to `casts` instead, once per storage in `cast_seen` (shared by the step's calls)."""

    def __init__(self, exclude: set[int], cast_seen: set[int] | None = None):
        self.seen, self.exclude = set(), exclude
        self.cast_seen = set() if cast_seen is None else cast_seen
        self.total = self.largest = self.casts = 0
        self.current: BlockCall | None = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key in self.exclude or key in self.cast_seen:
            return t
        if cast_of_parameter(t):
            self.cast_seen.add(key)
            self.casts += storage_bytes(t)
        elif key not in self.seen:
            self.seen.add(key)
            size = storage_bytes(t)
            self.total += size
            self.largest = max(self.largest, size)
            if self.current is not None:
                self.current.saved += size
        return t


def _unpack(t: torch.Tensor) -> torch.Tensor:
    return t


class _BlockHooks:
    """Forward hooks opening a BlockCall per block call: saved bytes (memory pass) or FLOPs (flop pass)."""

    def __init__(
        self,
        blocks: list[nn.Module],
        calls: list[BlockCall],
        saved: _Saved | None = None,
        counter: FlopCounterMode | None = None,
    ):
        self.calls, self.saved, self.counter = calls, saved, counter
        self.position = 0
        self.handles = [
            h
            for i, block in enumerate(blocks)
            for h in (block.register_forward_pre_hook(self._pre(i)), block.register_forward_hook(self._post))
        ]

    def _pre(self, index: int):
        def hook(_module, args):
            if self.saved is not None:
                call = BlockCall(index, inputs=storage_bytes(args[0]))
                self.calls.append(call)
                self.saved.current = call
            else:
                self.calls[self.position].flops -= self.counter.get_total_flops()

        return hook

    def _post(self, _module, _args, _output):
        if self.saved is not None:
            self.saved.current = None
        else:
            self.calls[self.position].flops += self.counter.get_total_flops()
            self.position += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class _StandIn(nn.Module):
    """Runs `net` on fake tensors and answers with random real tensors of its output shapes."""

    def __init__(self, net: nn.Module, fake: FakeTensorMode, trace: StepTrace, role: str):
        super().__init__()
        self.net, self.fake, self.trace, self.role = net, fake, trace, role
        self.exclude = {storage_key(p) for p in net.parameters()}
        self.cast_seen: set[int] = set()  # autocast's casts of the weights, kept by its cache for the whole step

    def forward(self, *args, **kwargs):
        args, kwargs = tree_map_only(torch.Tensor, self.fake.from_tensor, (args, kwargs))
        blocks = block_modules(self.net)
        student = self.role == "student" and torch.is_grad_enabled()
        first_call = len(self.trace.blocks)
        if student:  # memory pass
            saved = _Saved(self.exclude, self.cast_seen)
            hooks = _BlockHooks(blocks, self.trace.blocks, saved=saved)
            try:
                with self.fake, saved_tensors_hooks(saved.pack, _unpack):
                    out = self.net(*args, **kwargs)
            finally:
                hooks.remove()
            self.trace.net_saved += saved.total
            self.trace.weight_casts += saved.casts
            self.trace.largest_saved = max(self.trace.largest_saved, saved.largest)
        counter = FlopCounterMode(display=False)
        hooks = _BlockHooks(blocks, self.trace.blocks[first_call:], counter=counter) if student else None
        try:
            with self.fake, torch.no_grad(), _math_attention(self.net), counter:
                flop_out = self.net(*args, **kwargs)
        finally:
            if hooks is not None:
                hooks.remove()
        if self.role == "student":
            self.trace.student_flops += counter.get_total_flops()
            self.trace.student_calls += 1
        else:
            self.trace.teacher_flops += counter.get_total_flops()
            self.trace.teacher_calls += 1
            out = flop_out
        return tree_map_only(FakeTensor, lambda f: _real_like(f, student), out)


def _real_like(fake: torch.Tensor, grad: bool) -> torch.Tensor:
    if not fake.dtype.is_floating_point:
        return torch.zeros(fake.shape, dtype=fake.dtype)
    return torch.randn(fake.shape, dtype=fake.dtype).requires_grad_(grad)


class TracingEngine(Engine):
    """The engine of a traced step. `setup` makes the method's nets, built on the meta device, fake tensors (no
    memory) and puts each behind a `_StandIn`, as a real engine wraps them; the forward runs in the recipe's mixed
    precision (fp16 traced as bf16: the same bytes per element) while the bytes the loss saves are counted. The
    stand-ins answer with fresh tensors, so backward runs through the loss arithmetic only and no gradient reaches
    the fake weights: the optimizer step and the EMA have nothing to update, and this engine holds no memory (the
    planner counts the state from the traced parameter counts)."""

    def __init__(self, engine_cfg, optim_cfg, trace: StepTrace):
        self.cfg, self.optim_cfg, self.trace = engine_cfg, optim_cfg, trace
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.loss_saved = _Saved(exclude=set())

    def setup(self, method) -> None:
        trace, student, teacher = self.trace, method.student, method.teacher
        with self.fake:
            for net in (student, teacher):
                if net is not None:
                    net.to_empty(device="cpu")
        trace.params = sum(p.numel() for p in student.parameters())
        trace.trainable = sum(p.numel() for p in student.parameters() if p.requires_grad)
        blocks = block_modules(student)
        trace.depth = len(blocks)
        trace.block_params = sum(p.numel() for b in blocks for p in b.parameters())
        trace.student_cast = sum(p.numel() for _, p in cast_parameters(student) if p.requires_grad)
        if teacher is not None:
            trace.teacher_params = sum(p.numel() for p in teacher.parameters())
            trace.teacher_cast = sum(p.numel() for _, p in cast_parameters(teacher))
        nets = [n for n in (student, teacher) if n is not None]
        trace.buffers = sum(b.numel() * b.element_size() for net in nets for b in net.buffers())
        method.student = _StandIn(student, self.fake, trace, "student")
        if teacher is not None:
            method.teacher = _StandIn(teacher, self.fake, trace, "teacher")
        self.optimizer = build_optimizer(
            param_groups(named_parameters(method.student), self.optim_cfg), self.optim_cfg, CPU, fused=False
        )

    @contextlib.contextmanager
    def autocast(self):
        mixed = self.cfg.precision != "fp32"
        with saved_tensors_hooks(self.loss_saved.pack, _unpack), torch.autocast("cpu", torch.bfloat16, enabled=mixed):
            yield
        self.trace.loss_saved = self.loss_saved.total
        self.trace.largest_saved = max(self.trace.largest_saved, self.loss_saved.largest)

    def backward(self, loss: torch.Tensor) -> None:
        with self.micro_batch():
            loss.backward()

    def step(self, frozen=None, guard=None) -> dict:
        self.check_accumulated()
        self.micro_step = 0
        return {}

    def ema(self, momentum: float, guard=None) -> None:
        pass  # fake teacher weights: nothing to average

    def memory(self) -> dict[str, int]:
        return dict.fromkeys(MEMORY_KEYS, 0)

    def export_state_dict(self, which: str = "teacher") -> dict[str, torch.Tensor]:
        raise NotImplementedError("a traced step has fake weights: nothing to export")


def trace_step(cfg, images: int = TRACE_IMAGES, info: ParallelContext | None = None) -> StepTrace:
    """Trace one step of recipe `cfg` with `images` images per rank, at the epoch where any region loss has started,
    run by the training step itself (scale.loop.step.TrainStep) with a `TracingEngine`. With `info` (the run's parallel
    context) it is collective over the data-parallel group: every rank must call it (the loss may all-reduce, e.g.
    DINO's center)."""
    from scale.loop.step import TrainStep

    info = info or ParallelContext(0, 1, 0, "127.0.0.1", 0, "single")
    epoch = int(cfg.method.esvit.region_from_epoch)
    cfg = trace_config(cfg, images, info.dp_size, info.shard_size)
    trace = StepTrace(images=images)
    step = TrainStep(
        cfg,
        info,
        CPU,
        lambda: SyntheticLoader(cfg, info.dp_rank, info.dp_size),
        make_engine=lambda engine_cfg, optim_cfg, *_: TracingEngine(engine_cfg, optim_cfg, trace),
    )
    batch, _ = step.next_batch(step.batches())
    trace.input_bytes = sum(c.numel() * c.element_size() for c in batch.crops)
    step(epoch, batch)
    return trace

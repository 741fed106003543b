"""What one training step of a recipe computes and keeps, counted on fake tensors: no memory, no compute, so
ViT-L/7 or ViT-H cost nothing.

The method's own `loss` runs for real on a tiny batch (2 images of the recipe's crop layout), with its student and
teacher replaced by stand-ins: each call runs the real net on fake CPU tensors (FakeTensorMode, the kernels
training would pick, e.g. the CPU fused attention) and returns random real tensors of the net's output shapes, so
the loss arithmetic (cross-entropies over 65536 prototypes, EsViT's per-token region loss) is measured too. Counted:
- FLOPs of every student and teacher forward (math attention path: torch's FlopCounterMode has no formula for the
  fused CPU kernel), per transformer-block call as well;
- bytes saved for backward (saved-tensor hooks, each storage once, parameters excluded), per block call, plus
  each block call's input (what non-reentrant activation checkpointing keeps instead), and by the loss.
"""

from dataclasses import dataclass, field

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._pytree import tree_map_only
from torch.utils.flop_counter import FlopCounterMode

from scale.bench.synthetic import random_batch
from scale.engine.activation import part_blocks
from scale.methods.base import StepContext
from scale.models.flops import _math_attention

TRACE_IMAGES = 2  # BatchNorm heads (MoCo v3) need more than one image per view


@dataclass
class BlockCall:
    index: int  # block position in its backbone
    saved: int = 0  # bytes saved for backward inside this call
    inputs: int = 0  # bytes of the call's input
    flops: int = 0


@dataclass
class StepTrace:
    images: int
    student_flops: int = 0  # forward FLOPs of every student call of the step (all crops)
    teacher_flops: int = 0
    net_saved: int = 0  # bytes the student's forward saves for backward
    loss_saved: int = 0  # bytes the loss arithmetic outside the nets saves
    largest_saved: int = 0  # the largest single saved storage
    blocks: list[BlockCall] = field(default_factory=list)  # the student's block calls, in order
    student_calls: int = 0  # forwards of the student net in the step
    teacher_calls: int = 0
    block_params: int = 0  # student parameters inside transformer blocks (gathered per backbone call by FSDP)
    depth: int = 0  # transformer blocks of the student
    input_bytes: int = 0  # the batch's crops
    params: int = 0  # student parameters (all)
    trainable: int = 0
    teacher_params: int = 0
    buffers: int = 0  # bytes of student + teacher buffers

    def per_image(self, value: float) -> float:
        return value / self.images


def block_modules(net: nn.Module) -> list[nn.Module]:
    """The transformer blocks of the net's parts (what the engines checkpoint and shard)."""
    return [block for part in net.children() for block in part_blocks(part)]


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class _Saved:
    """Saved-tensor hook counting each storage once (parameters excluded); `current` is the block call being run."""

    def __init__(self, exclude: set[int]):
        self.seen, self.exclude = set(), exclude
        self.total = self.largest = 0
        self.current: BlockCall | None = None

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self.seen and key not in self.exclude:
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

    def forward(self, *args, **kwargs):
        args, kwargs = tree_map_only(torch.Tensor, self.fake.from_tensor, (args, kwargs))
        blocks = block_modules(self.net)
        student = self.role == "student" and torch.is_grad_enabled()
        first_call = len(self.trace.blocks)
        if student:  # memory pass
            saved = _Saved(self.exclude)
            hooks = _BlockHooks(blocks, self.trace.blocks, saved=saved)
            try:
                with self.fake, saved_tensors_hooks(saved.pack, _unpack):
                    out = self.net(*args, **kwargs)
            finally:
                hooks.remove()
            self.trace.net_saved += saved.total
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


def trace_step(cfg, images: int = TRACE_IMAGES, dp_group=None) -> StepTrace:
    """Trace one micro-batch step of recipe `cfg` with `images` images (after any region-loss start epoch). In a
    process group it is collective over `dp_group`: every rank must call it (the loss may all-reduce, e.g. DINO's
    center)."""
    from scale.methods import build_method

    epoch = int(cfg.method.dino.region_from_epoch)
    method = build_method(cfg, 1, epoch + 1, device="meta", dp_group=dp_group)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    trace = StepTrace(images=images)
    nets = {"student": method.student, "teacher": method.teacher}
    with fake:
        for net in nets.values():
            if net is not None:
                net.to_empty(device="cpu")
    student = nets["student"]
    trace.params = sum(p.numel() for p in student.parameters())
    trace.trainable = sum(p.numel() for p in student.parameters() if p.requires_grad)
    blocks = block_modules(student)
    trace.depth = len(blocks)
    trace.block_params = sum(p.numel() for b in blocks for p in b.parameters())
    if nets["teacher"] is not None:
        trace.teacher_params = sum(p.numel() for p in nets["teacher"].parameters())
    trace.buffers = sum(b.numel() * b.element_size() for net in nets.values() if net is not None for b in net.buffers())
    method.student = _StandIn(student, fake, trace, "student")
    if nets["teacher"] is not None:
        method.teacher = _StandIn(nets["teacher"], fake, trace, "teacher")
    loss_saved = _Saved(exclude=set())
    ctx = StepContext(step=0, epoch=epoch, steps_per_epoch=1, total_steps=epoch + 1)
    batch = random_batch(cfg, images, torch.Generator().manual_seed(0))
    trace.input_bytes = sum(c.numel() * c.element_size() for c in batch.crops)
    # mixed precision as the engines run it (torch.autocast; fp16 traced as bf16: the same bytes per element)
    mixed = cfg.engine.precision != "fp32"
    with saved_tensors_hooks(loss_saved.pack, _unpack), torch.autocast("cpu", torch.bfloat16, enabled=mixed):
        method.loss(batch, ctx)
    trace.loss_saved = loss_saved.total
    trace.largest_saved = max(trace.largest_saved, loss_saved.largest)
    return trace

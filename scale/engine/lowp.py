"""The weights autocast runs in the lower dtype, held in that dtype and cast by one fused copy instead of one cast per
weight.

Autocast casts every Linear and Conv weight and bias to the autocast dtype where it is used: the teacher's (no
gradients) on every forward, the student's once per autocast region (its cache keeps casts of leaf tensors that
require gradients), and each cast has its own backward that casts the gradient back. Here a net's forward runs a
shadow of it whose Linear and Conv weights and biases are tensors in the lower dtype; its other parameters and its
buffers are the net's own tensors. The fp32 net stays what the optimizer, the EMA, checkpoints and exports see.

- Teacher: the shadow's weights are refreshed from the fp32 teacher by one fused copy after each EMA update.
- Student: the first forward in each of the engine's autocast regions copies the fp32 weights into the shadow's
  with one fused copy per block of the net (a module path up to its last list index: `backbone.blocks.3`), an
  autograd function whose backward casts the block's gradients back to fp32 in one fused copy. Per block, not one
  copy for the whole net: a block's fp32 gradients then arrive as its backward ends, so that DDP still all-reduces
  its buckets while the backward runs.

The values are bit-identical to autocast's: the copy rounds as autocast's cast does, and the gradient of a weight
used by several passes (DINO's global and local crops) is summed in the lower dtype before its cast, as autocast's
cached cast has it. Under FSDP2 the mixed-precision policy casts the gathered weights once per forward already, and
compiled blocks fuse their casts: neither uses this.
"""

import contextlib
import copy

import torch
from torch import nn

CAST = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # modules whose parameters autocast runs in the lower dtype


def cast_parameters(net: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters autocast casts (Linear and Conv weights and biases; not a parametrized weight such as
    DINO's weight-normed last layer, which is computed in fp32 at each forward), named by their module."""
    return [(name, p) for name, m in net.named_modules() if isinstance(m, CAST) for p in m.parameters(recurse=False)]


def shadow_of(net: nn.Module, masters: list[torch.Tensor], lowp: list[torch.Tensor]) -> nn.Module:
    """A copy of `net` holding `lowp` in place of `masters` and sharing every other parameter and buffer."""
    memo = {id(t): t for t in (*net.parameters(), *net.buffers())}  # shared, not copied
    memo.update({id(master): low for master, low in zip(masters, lowp, strict=True)})
    return copy.deepcopy(net, memo)


class Shadowed:
    """Base: `net`'s forward (the entry point the methods call, `method.teacher(...)`) runs the shadow, in the
    net's train/eval mode."""

    def __init__(self, net: nn.Module, masters: list[torch.Tensor], lowp: list[torch.Tensor]):
        self.net, self.masters, self.lowp = net, masters, lowp
        self.shadow = shadow_of(net, masters, lowp)
        net.forward = self.forward

    def cast(self) -> None:
        """Before each forward: bring the low-precision weights up to date where the forward does it."""

    def forward(self, *args, **kwargs):
        if self.shadow.training != self.net.training:
            self.shadow.train(self.net.training)
        self.cast()
        return self.shadow(*args, **kwargs)


class LowPrecisionTeacher(Shadowed):
    def __init__(self, teacher: nn.Module, dtype: torch.dtype):
        masters = [p for _, p in cast_parameters(teacher)]
        super().__init__(teacher, masters, [nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in masters])

    @torch.no_grad()
    def refresh(self) -> None:
        """After every change of the teacher's weights (EMA, checkpoint load): one fused copy."""
        if self.masters:
            torch._foreach_copy_(self.lowp, self.masters)


class FusedCast(torch.autograd.Function):
    """`lowp` <- `masters` in one fused copy, returning the `lowp` tensors themselves (each call gives them this
    call's autograd history: the shadow keeps holding the same tensors); backward: their gradients cast to the
    masters' dtype in one fused copy. A gradient that never came (a weight the forward did not use) stays None."""

    @staticmethod
    def forward(ctx, lowp: list[torch.Tensor], *masters: torch.Tensor):
        ctx.set_materialize_grads(False)
        ctx.masters = masters  # read for their shapes, dtype and strides only
        torch._foreach_copy_(lowp, masters)
        return tuple(lowp)

    @staticmethod
    def backward(ctx, *grads):
        given = [i for i, g in enumerate(grads) if g is not None]
        out: list = [None] * len(grads)
        if given:
            fp32 = views_of_one_buffer([ctx.masters[i] for i in given])
            torch._foreach_copy_(fp32, [grads[i] for i in given])
            for i, g in zip(given, fp32, strict=True):
                out[i] = g
        return (None, *out)


ALIGN_BYTES = 128  # each view starts on a multiple: the alignment vectorised kernels (fused AdamW, foreach) load at


def views_of_one_buffer(like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Uninitialised tensors laid out as `like` (a block's parameters, of one dtype and device: their shapes and
    strides, what AccumulateGrad takes over as the gradient without a copy), views of one allocation instead of one
    each. A parameter is dense, so its view spans its number of elements."""
    step = max(ALIGN_BYTES // like[0].element_size(), 1)
    offsets, end = [], 0
    for t in like:
        offsets.append(end)
        end += -(-t.numel() // step) * step
    flat = torch.empty(end, dtype=like[0].dtype, device=like[0].device)
    return [flat.as_strided(t.shape, t.stride(), offset) for t, offset in zip(like, offsets, strict=True)]


def block_of(module_name: str) -> str:
    """The block a module belongs to: its path up to its last list index ('backbone.blocks.3.attn.qkv' ->
    'backbone.blocks.3', 'head.mlp.0' -> itself); a module outside any list is its own block."""
    parts = module_name.split(".")
    indices = [i for i, part in enumerate(parts) if part.isdigit()]
    return ".".join(parts[: indices[-1] + 1]) if indices else module_name


class LowPrecisionStudent(Shadowed):
    """The student's trainable Linear and Conv weights in `dtype`, copied from the fp32 weights by one FusedCast per
    block. Frozen ones are left to autocast (they need no gradient path).

    As autocast's own cache, the cast is made once per autocast region of the engine (`region()`: a micro-batch's
    forward, a validation batch) and reused by every forward in it, so a method may call the student once per crop
    resolution: the passes share the cast, and their gradients meet in it. Each region casts again, so the weights
    an optimizer step, an EMA or a checkpoint load wrote are always the ones used. A forward outside any region
    casts on every call (two such calls before one backward: autograd refuses it, as the first one's saved weights
    were overwritten)."""

    def __init__(self, student: nn.Module, dtype: torch.dtype):
        named = [(name, p) for name, p in cast_parameters(student) if p.requires_grad]
        masters = [p for _, p in named]
        lowp = [torch.empty_like(p, dtype=dtype) for p in masters]
        super().__init__(student, masters, lowp)
        blocks: dict[str, list[int]] = {}
        for i, (name, _) in enumerate(named):
            blocks.setdefault(block_of(name), []).append(i)
        self.blocks = [([lowp[i] for i in idx], [masters[i] for i in idx]) for idx in blocks.values()]
        self.depth = 0  # nesting of regions: only the outermost starts a new cast, as autocast clears its cache
        self.cast_with_grad: bool | None = None  # this region's cast: None (not made yet), with autograd history

    @contextlib.contextmanager
    def region(self):
        if self.depth == 0:
            self.cast_with_grad = None
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def cast(self) -> None:
        grad = torch.is_grad_enabled()
        # reuse this region's cast, unless it was made without gradients and this forward needs them (a recast
        # then overwrites tensors no graph holds)
        if self.depth and self.cast_with_grad is not None and (self.cast_with_grad or not grad):
            return
        for lowp, masters in self.blocks:
            FusedCast.apply(lowp, *masters)
        self.cast_with_grad = grad

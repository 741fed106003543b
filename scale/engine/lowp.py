"""The teacher's weights in the autocast dtype, cast once per step instead of on every call.

Autocast caches the casts of leaf tensors that require gradients, so the student's weights are cast once per step;
the teacher's (no gradients) are cast again on every forward, one launch per weight. Here the teacher's forward runs
a shadow of it whose Linear and Conv weights and biases (what autocast casts to the lower dtype) are held in that
dtype and refreshed from the fp32 teacher by one fused copy after each EMA update; its other parameters and its
buffers are the teacher's own tensors. The outputs are bit-identical: the copy rounds as autocast's cast does.
The fp32 teacher stays what the EMA, checkpoints and exports see. Under FSDP2 the mixed-precision policy casts the
gathered weights once per forward already, and compiled blocks fuse their casts: neither uses this.
"""

import copy

import torch
from torch import nn

CAST = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # modules whose parameters autocast runs in the lower dtype


class LowPrecisionTeacher:
    def __init__(self, teacher: nn.Module, dtype: torch.dtype):
        masters = [p for m in teacher.modules() if isinstance(m, CAST) for p in m.parameters(recurse=False)]
        lowp = [nn.Parameter(p.detach().to(dtype), requires_grad=False) for p in masters]
        memo = {id(t): t for t in (*teacher.parameters(), *teacher.buffers())}  # shared, not copied
        memo.update({id(master): low for master, low in zip(masters, lowp, strict=True)})
        self.shadow = copy.deepcopy(teacher, memo)
        self.teacher, self.masters, self.lowp = teacher, masters, lowp
        teacher.forward = self.forward  # the entry point the methods call (`method.teacher(...)`)

    def forward(self, *args, **kwargs):
        if self.shadow.training != self.teacher.training:
            self.shadow.train(self.teacher.training)
        return self.shadow(*args, **kwargs)

    @torch.no_grad()
    def refresh(self) -> None:
        """After every change of the teacher's weights (EMA, checkpoint load): one fused copy."""
        if self.masters:
            torch._foreach_copy_(self.lowp, self.masters)

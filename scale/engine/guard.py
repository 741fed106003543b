"""The non-finite guard: a sticky flag on the device that the optimizer step and the EMA honour, read by the host
only on log steps and before checkpoints (as GradScaler's found-inf, which fused AdamW skips its update on).

A step is bad when, on any rank,
- its loss is not finite (any micro-batch): checked and all-reduced before the update, which is then skipped;
- its gradient norm is not finite (the gradients overflowed; not under fp16 loss scaling, where the scaler skips
  such steps and lowers its scale): checked before the update, which is skipped;
- the update overflowed: the sum of squares of the parameters after the step is not finite in fp32, i.e. some
  weight grew beyond about 1e19 (an absurd learning rate, overflow inside the optimizer). That update is already
  applied; the run stops at the next read and writes no checkpoint, so none ever holds it.
Once set, the flag stays set: later updates and EMA steps are skipped too, until the host reads it and stops the run.
The first bad step (0-based) and its kind are kept on the device beside the flag.
"""

import torch
import torch.distributed as dist

KINDS = {1: "non-finite loss", 2: "non-finite gradient norm", 3: "overflowing update (parameters beyond fp32 range)"}
LOSS, GRADIENT, UPDATE = 1, 2, 3
_NONE = 2**62  # "no bad step" in the min-reduced first-bad code
_FLOAT_MAX = torch.finfo(torch.float32).max


class FiniteGuard:
    def __init__(self, device: torch.device, group: dist.ProcessGroup | None = None):
        """`group`: the ranks that agree on the flag (the data-parallel group, every rank; None: this process)."""
        self.group = group
        self.step = 0  # the step being checked (0-based), set by `begin`
        self.bad = torch.zeros((), dtype=torch.float32, device=device)  # 0 or 1; the optimizers' found_inf
        self.first = torch.full((), _NONE, dtype=torch.int64, device=device)  # step * 4 + kind
        self._set = torch.ones((), dtype=torch.float32, device=device)  # what `bad` becomes (where needs a tensor)

    def begin(self, step: int) -> None:
        self.step = step

    def _mark(self, kind: int, value: torch.Tensor, nonnegative: bool = False) -> None:
        """Set the flag when the 0-d fp32 `value` is not finite. Four launches for a `nonnegative` value (a norm:
        finite exactly when <= the largest float, NaN compares false), five for any (x - x is 0 for a finite x,
        NaN for inf or NaN)."""
        good = value.le(_FLOAT_MAX) if nonnegative else (value - value).eq(0)
        torch.minimum(self.first, torch.where(good, _NONE, self.step * 4 + kind), out=self.first)
        torch.where(good, self.bad, self._set, out=self.bad)  # sticky: once set (by any rank), it stays set

    def check_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """Before the update: fold this step's losses into the flag and agree on it across ranks (one all-reduce
        of a scalar, no host wait). Returns the flag for the optimizer step."""
        total = losses[0].detach() if len(losses) == 1 else torch.stack([loss.detach() for loss in losses]).sum()
        self._mark(LOSS, total.float())  # a no-op on an fp32 loss
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(self.bad, op=dist.ReduceOp.MAX, group=self.group)
        return self.bad

    def check_gradient(self, grad_norm: torch.Tensor) -> None:
        self._mark(GRADIENT, grad_norm, nonnegative=True)

    @torch.no_grad()
    def check_update(self, locals_: list[torch.Tensor]) -> None:
        """After the update: the fp32 sum of squares of this rank's parameters overflows or is NaN. `locals_`: the
        tensors this rank holds (local shards, not DTensors), listed once by the engine."""
        if not locals_:
            return
        # the norm of the norms, sqrt(sum of squares): not finite exactly when the fp32 sum of squares is not
        # (norm kernels sum the squares without rescaling)
        self._mark(
            UPDATE, torch.linalg.vector_norm(torch.stack(torch._foreach_norm(locals_)), dtype=torch.float32), True
        )

    def read(self) -> tuple[int, str] | None:
        """Collective, a host read: None when every step so far was good on every rank, else the first bad
        step (0-based) over all ranks and what went wrong."""
        state = torch.stack([self.bad.to(torch.int64), -self.first])
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(
                state, op=dist.ReduceOp.MAX, group=self.group
            )  # max of -first: the earliest bad step of any rank
        bad, neg_first = state.tolist()
        if not bad:
            return None
        code = -neg_first
        return code // 4, KINDS[code % 4]

    def is_first_rank(self, step: int) -> bool:
        """Whether this rank saw the first bad step itself (a host read; call after `read` found one)."""
        return int(self.first) // 4 == step


def guarded_step(optimizer: torch.optim.Optimizer, guard: FiniteGuard | None) -> None:
    """optimizer.step(), skipped when the guard's flag is set: on the device by the optimizers that take a found_inf
    (torch's fused AdamW, Adam and SGD skip their whole update in the kernel, step counts included), otherwise after
    a host read of the flag (timm's LARS and LAMB: one wait per step)."""
    if guard is None:
        optimizer.step()
    elif getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = guard.bad
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not guard.bad.item():
        optimizer.step()

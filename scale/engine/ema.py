"""Teacher EMA over local tensors: teacher = m * teacher + (1 - m) * student.

The teacher is sharded (or replicated) exactly like the student, so each rank updates its own shards with one
fused `_foreach_lerp_` and no communication. Only parameters are averaged (buffers are not, as in DINO/MoCo).
"""

import torch
from torch import nn

from scale.engine.params import local, named_parameters


def ema_pairs(teacher: nn.Module, student: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Matching local tensors (teacher, student) by unwrapped name; the teacher's names must be a subset."""
    student_params = dict(named_parameters(student))
    teacher_locals, student_locals = [], []
    for name, t_param in named_parameters(teacher):
        if name not in student_params:
            raise ValueError(f"teacher parameter '{name}' has no student counterpart")
        t, s = local(t_param.data), local(student_params[name].data)
        if t.shape != s.shape:
            raise ValueError(
                f"teacher '{name}' is held as {tuple(t.shape)} but the student as {tuple(s.shape)}: "
                f"the teacher must be sharded like the student"
            )
        teacher_locals.append(t)
        student_locals.append(s.to(t.dtype))
    return teacher_locals, student_locals


@torch.no_grad()
def ema_update(
    teacher: nn.Module,
    student: nn.Module,
    momentum: float,
    skip: torch.Tensor | None = None,
    pairs: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> None:
    """`skip`: a 0/1 flag on the device (the non-finite guard's); when set, the weight is 0 and the teacher keeps
    its values (exactly, while the student is finite: t + 0 * (s - t) = t) without a host read. `pairs`: the
    tensors of `ema_pairs(teacher, student)`, built once by an engine whose tensors stay in place."""
    teacher_locals, student_locals = pairs if pairs is not None else ema_pairs(teacher, student)
    if not teacher_locals:
        return
    if skip is None:
        torch._foreach_lerp_(teacher_locals, student_locals, 1.0 - momentum)
    else:
        # t + w * (s - t), lerp's formula for w < 0.5, with w a 0-d tensor on the device: three fused launches.
        # (_foreach_lerp_ takes a tensor weight only per tensor, which CUDA runs one kernel per tensor, or as a
        # whole tensor it reads on the host)
        # (1 - m) - (1 - m) * skip in one launch
        weight = torch.rsub(skip.to(teacher_locals[0].device).float(), 1.0 - momentum, alpha=1.0 - momentum)
        for dtype in {t.dtype for t in teacher_locals}:
            group = [i for i, t in enumerate(teacher_locals) if t.dtype == dtype]
            ts = [teacher_locals[i] for i in group] if len(group) < len(teacher_locals) else teacher_locals
            ss = [student_locals[i] for i in group] if len(group) < len(teacher_locals) else student_locals
            diff = torch._foreach_sub(ss, ts)
            torch._foreach_mul_(diff, weight.to(dtype))
            torch._foreach_add_(ts, diff)


@torch.no_grad()
def copy_student_to_teacher(teacher: nn.Module, student: nn.Module) -> None:
    teacher_locals, student_locals = ema_pairs(teacher, student)
    if teacher_locals:
        torch._foreach_copy_(teacher_locals, student_locals)

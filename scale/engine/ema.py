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
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float, skip: torch.Tensor | None = None) -> None:
    """`skip`: a 0/1 flag on the device (the non-finite guard's); when set, the weight is 0 and the teacher keeps
    its values (exactly, while the student is finite: t + 0 * (s - t) = t) without a host read."""
    teacher_locals, student_locals = ema_pairs(teacher, student)
    if not teacher_locals:
        return
    if skip is None:
        torch._foreach_lerp_(teacher_locals, student_locals, 1.0 - momentum)
    else:
        # one 0-d weight per tensor (the tensor-weight overload of _foreach_lerp_ would read it on the host)
        weight = (1.0 - skip.to(teacher_locals[0].device).float()) * (1.0 - momentum)
        by_dtype = {t.dtype: weight.to(t.dtype) for t in teacher_locals}
        torch._foreach_lerp_(teacher_locals, student_locals, [by_dtype[t.dtype] for t in teacher_locals])


@torch.no_grad()
def copy_student_to_teacher(teacher: nn.Module, student: nn.Module) -> None:
    teacher_locals, student_locals = ema_pairs(teacher, student)
    if teacher_locals:
        torch._foreach_copy_(teacher_locals, student_locals)

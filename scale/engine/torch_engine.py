"""What DDP and FSDP2 share: device placement, activation checkpointing, gradient accumulation, fp16 loss scaling,
clipping across shards, frozen parameters, the shard-local EMA, memory accounting and DCP checkpoint state."""

import abc
import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.nn.parallel import DistributedDataParallel

from scale.engine.base import Engine
from scale.engine.clip import clip_gradients
from scale.engine.ema import ema_pairs, ema_update
from scale.engine.guard import FiniteGuard, guarded_step
from scale.engine.kinds import holds_low_precision_weights
from scale.engine.lowp import LowPrecisionStudent, LowPrecisionTeacher
from scale.engine.materialize import is_meta
from scale.engine.parallel import ParallelContext
from scale.engine.parallelize import parallelize
from scale.engine.params import local, named_parameters, nbytes
from scale.engine.precision import resolve_precision
from scale.methods.base import Method
from scale.optim import build_optimizer, init_state, keep_settings, param_groups, settings


def broadcast_module(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Make every rank of `group` hold its first rank's parameters and buffers (ranks seed differently)."""
    if group is not None and dist.get_world_size(group) > 1:
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, group=group, group_src=0)


def unwrapped(module: nn.Module) -> nn.Module:
    """The net inside a DDP wrapper."""
    return module.module if isinstance(module, DistributedDataParallel) else module


def model_bytes(module: nn.Module | None) -> int:
    return sum(nbytes(p) for p in module.parameters()) if module is not None else 0


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(nbytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))


class TorchEngine(Engine):
    kind = ""
    sharded = False  # parameters are DTensor shards (FSDP2)

    def __init__(self, engine_cfg, optim_cfg, dist_info: ParallelContext, device: torch.device):
        self.cfg, self.optim_cfg, self.dist_info, self.device = engine_cfg, optim_cfg, dist_info, device
        self.precision = resolve_precision(engine_cfg.precision, device)
        self.method: Method | None = None
        self.scaler = None
        self.micro_step = 0
        self._held: tuple | None = None  # (student parameters, EMA pairs), built at the first step
        self.lowp_teacher: LowPrecisionTeacher | None = None
        self.lowp_student: LowPrecisionStudent | None = None

    # --- what DDP and FSDP2 do differently
    @abc.abstractmethod
    def wrap(self, method: Method, meta: bool) -> None:
        """Wrap method.student / method.teacher in place; materialise them when built on the meta device."""

    @abc.abstractmethod
    def set_gradient_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients across ranks (off for all but the last micro-batch)."""

    @abc.abstractmethod
    def make_scaler(self):
        """fp16 loss scaler."""

    # --- the Engine contract
    def setup(self, method: Method) -> None:
        self.method = method
        meta = is_meta(method.student) or (method.teacher is not None and is_meta(method.teacher))
        if not meta:
            for module in self.modules():
                module.to(self.device)
                broadcast_module(module, self.dist_info.dp_group)
        parallelize(method, self.cfg, self.precision, self.dist_info, lambda: self.wrap(method, meta))
        self._held = None
        # the student's and the teacher's forwards read weights kept in the autocast dtype (scale.engine.lowp)
        if holds_low_precision_weights(self.kind, self.cfg.precision, self.cfg.compile):
            if method.teacher is not None:
                self.lowp_teacher = LowPrecisionTeacher(method.teacher, self.precision.dtype)
            # not with find_unused_parameters: DDP's search of the graph would reach every weight of a block through
            # its one fused cast, count them all as used, and wait for a gradient that an unused one never gets
            if not self.cfg.find_unused_parameters:
                self.lowp_student = LowPrecisionStudent(unwrapped(method.student), self.precision.dtype)
        groups = param_groups(named_parameters(method.student), self.optim_cfg)
        self.optimizer = build_optimizer(groups, self.optim_cfg, self.device, sharded=self.sharded, fused=True)
        init_state(self.optimizer)
        if self.precision.needs_loss_scaling:
            self.scaler = self.make_scaler()
        self.micro_step = 0
        self.set_gradient_sync(self.cfg.grad_accum == 1)

    def modules(self) -> list[nn.Module]:
        return [m for m in (self.method.student, self.method.teacher) if m is not None]

    @contextlib.contextmanager
    def autocast(self):
        # the student's low-precision weights are cast once per region, as autocast's cache keeps its own casts
        student = self.lowp_student.region() if self.lowp_student is not None else contextlib.nullcontext()
        with self.precision.autocast(), student:
            yield

    def backward(self, loss: torch.Tensor) -> None:
        with self.micro_batch():
            loss = loss / self.cfg.grad_accum
            if self.scaler is not None:
                loss = self.scaler.scale(loss)
            loss.backward()
        self.set_gradient_sync(self.micro_step == self.cfg.grad_accum - 1)

    def step(self, frozen: Callable[[str], bool] | None = None, guard: FiniteGuard | None = None) -> dict:
        self.check_accumulated()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        with_grad = [(n, p) for n, p in named_parameters(self.method.student) if p.grad is not None]
        with self.phase("clip"):
            grads = [p.grad for _, p in with_grad]
            grad_norm = clip_gradients(grads, self.optim_cfg.clip_grad, self.optim_cfg.clip_mode)
        # after clipping, as DINO cancels the last layer's gradients after clip_gradients; no gradient: no update
        for name, param in with_grad:
            if frozen is not None and frozen(name):
                param.grad = None
        metrics = {"grad_norm": grad_norm}
        if self.scaler is not None:
            # fp16 (GPU): the scaler skips overflowing steps itself; the guard's flag is read on the host here
            if guard is None or not guard.bad.item():
                self.scaler.step(self.optimizer)
            self.scaler.update()
            metrics["loss_scale"] = self.scaler._get_scale_async()
        else:
            if guard is not None:
                with self.phase("guard"):
                    guard.check_gradient(grad_norm)
            with self.phase("optimizer"):
                guarded_step(self.optimizer, guard)
        if guard is not None:
            with self.phase("guard"):
                guard.check_update(self.held()[0])
        with self.phase("optimizer"):
            self.optimizer.zero_grad(set_to_none=True)
        self.micro_step = 0
        self.set_gradient_sync(self.cfg.grad_accum == 1)
        return metrics

    def ema(self, momentum: float, guard: FiniteGuard | None = None) -> None:
        if self.method.teacher is None:
            raise RuntimeError("ema() called but the method has no teacher")
        teacher, student = self.method.teacher, self.method.student
        ema_update(teacher, student, momentum, None if guard is None else guard.bad, pairs=self.held()[1])
        if self.lowp_teacher is not None:
            self.lowp_teacher.refresh()

    def held(self) -> tuple[list[torch.Tensor], tuple | None]:
        """The student's local parameter tensors and the teacher's EMA pairs, listed once: DDP and FSDP2 keep them
        in place (optimizer steps, EMA and checkpoint loads write into them), so a step walks no parameter list."""
        if self._held is None:
            student = [local(p.detach()) for _, p in named_parameters(self.method.student)]
            pairs = ema_pairs(self.method.teacher, self.method.student) if self.method.teacher is not None else None
            self._held = (student, pairs)
        return self._held

    def memory(self) -> dict[str, int]:
        """Bytes this rank holds; gradients counted at their size after backward (fp32, local shards); "lowp": the
        weights kept in the autocast dtype (scale.engine.lowp)."""
        student = self.method.student
        grads = sum(nbytes(p) for p in student.parameters() if p.requires_grad)
        report = {
            "params": model_bytes(student),
            "grads": grads,
            "optimizer": optimizer_bytes(self.optimizer),
            "teacher": model_bytes(self.method.teacher),
            "lowp": sum(
                nbytes(t) for shadowed in (self.lowp_student, self.lowp_teacher) if shadowed for t in shadowed.lowp
            ),
        }
        report["total"] = sum(report.values())
        return report

    # --- checkpoint state (torch.distributed.checkpoint)
    def state_dict(self) -> dict:
        student_sd, optim_sd = get_state_dict(self.method.student, self.optimizer)
        state = {"student": student_sd, "optimizer": optim_sd}
        if self.method.teacher is not None:
            state["teacher"] = get_model_state_dict(self.method.teacher)
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Without "optimizer" (train.reset=[optimizer]) the optimizer keeps its fresh state; with it, its moments
        come from the checkpoint and its settings (betas, eps...) from this run's recipe."""
        if "optimizer" in state:
            recipe = settings(self.optimizer)
            set_state_dict(
                self.method.student,
                self.optimizer,
                model_state_dict=state["student"],
                optim_state_dict=state["optimizer"],
            )
            keep_settings(self.optimizer, recipe)
        else:
            set_model_state_dict(self.method.student, state["student"])
        if self.method.teacher is not None:
            set_model_state_dict(self.method.teacher, state["teacher"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        if self.lowp_teacher is not None:
            self.lowp_teacher.refresh()

    def export_state_dict(self, which: str = "teacher") -> dict[str, torch.Tensor]:
        module = {"teacher": self.method.teacher, "student": self.method.student}[which]
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # copies: on CPU, unsharded tensors (buffers, DDP parameters) would otherwise alias the live module
        return {name: value.detach().clone() for name, value in state.items()}

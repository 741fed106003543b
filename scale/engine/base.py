"""The Engine contract: how a method's modules are wrapped, run in mixed precision, backpropagated and stepped.
DDP, FSDP2 and DeepSpeed implement it; the training loop is the only caller and never branches on the kind."""

import abc
import contextlib
from collections.abc import Callable

import torch

from scale.engine.guard import FiniteGuard
from scale.methods.base import Method


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


# what Engine.memory() reports, in this order (`scale bench`, the memory report and the planner compare them)
MEMORY_KEYS = ("params", "grads", "optimizer", "teacher", "lowp", "total")


class Engine(abc.ABC):
    optimizer: torch.optim.Optimizer
    # entered around the parts of `step` ("clip", "guard", "optimizer"): TrainStep sets its own phase hook here
    phase: Callable[[str], contextlib.AbstractContextManager] = staticmethod(no_phase)

    @abc.abstractmethod
    def setup(self, method: Method) -> None:
        """Move to the device, apply activation checkpointing, wrap `method.student` (and `method.teacher`, sharded
        identically) in place, and build the optimizer over the student's parameter groups."""

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    @abc.abstractmethod
    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (scaled for fp16 and gradient accumulation)."""

    # --- gradient accumulation, shared by the engines (they set self.cfg to the recipe's engine section)
    micro_step: int = 0  # backward calls since the last step()

    @contextlib.contextmanager
    def micro_batch(self):
        """Around one micro-batch's backward: refuses more than engine.grad_accum of them before step(), and counts
        it once its backward has returned."""
        if self.micro_step >= self.cfg.grad_accum:
            raise RuntimeError(
                f"backward called {self.micro_step + 1} times before step() with "
                f"engine.grad_accum={self.cfg.grad_accum}"
            )
        yield
        self.micro_step += 1

    def check_accumulated(self) -> None:
        """step() must follow exactly engine.grad_accum backward calls."""
        if self.micro_step != self.cfg.grad_accum:
            raise RuntimeError(
                f"step() after {self.micro_step} backward calls; engine.grad_accum={self.cfg.grad_accum}"
            )

    # the engine's step waits for the device anyway (DeepSpeed): the loop reads the non-finite guard before it
    syncs_each_step: bool = False

    @abc.abstractmethod
    def step(self, frozen: Callable[[str], bool] | None = None, guard: FiniteGuard | None = None) -> dict:
        """Clip, step the optimizer and zero the gradients; parameters for which `frozen(name)` is true get no
        update. With a `guard`: no update while its flag is set; the gradient norm and the updated parameters are
        checked into it. Returns metrics such as the gradient norm (tensors or numbers; read on log steps only)."""

    @abc.abstractmethod
    def ema(self, momentum: float, guard: FiniteGuard | None = None) -> None:
        """teacher = momentum * teacher + (1 - momentum) * student, over the teacher's parameters; skipped while
        the guard's flag is set."""

    @abc.abstractmethod
    def memory(self) -> dict[str, int]:
        """Bytes held by this rank, by MEMORY_KEYS: parameters, gradients, optimizer state, the EMA teacher, the
        weights kept in the autocast dtype, and their total."""

    # --- checkpointing (used by scale/checkpoint) ---
    # Engines whose state goes through torch.distributed.checkpoint (DDP, FSDP2) return DCP-ready nested dicts
    # here (torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict), keyed "student", "teacher",
    # "optimizer". DeepSpeed writes its own files instead: it sets native_checkpoint = True and implements
    # save_native(folder) / load_native(folder, saved_world_size) with its library's calls only, and hands the
    # tensors of any other file (the teacher's, the buffers of an elastic load) to scale.checkpoint.state, which
    # opens every file; `rollback_point` says what a load writes, so one rollback serves every engine.
    native_checkpoint: bool = False

    def state_dict(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} checkpoints natively: use save_native")

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} checkpoints natively: use load_native")

    def save_native(self, folder) -> None:
        raise NotImplementedError(f"{type(self).__name__} checkpoints through DCP: use state_dict")

    def load_native(self, folder, saved_world_size: int, optimizer: bool = True) -> None:
        raise NotImplementedError(f"{type(self).__name__} checkpoints through DCP: use load_state_dict")

    @abc.abstractmethod
    def export_state_dict(self, which: str = "teacher") -> dict[str, torch.Tensor]:
        """Collective: the full, unsharded CPU state dict of the teacher (or 'student') with unwrapped names on
        rank 0 (empty on other ranks), for exporting weights."""

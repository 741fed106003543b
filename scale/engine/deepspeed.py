"""DeepSpeed ZeRO 1, 2 and 3 behind the Engine interface.

The DeepSpeed config is generated from the recipe (stage, precision, clipping, gradient accumulation); the client
optimizer is a torch optimizer from scale.optim with the same parameter groups as the other engines.

- Precision: parameters, gradients and their reduction stay fp32 and bf16 runs under torch.autocast, exactly as
  under DDP (so the EMA teacher and the optimizer see fp32 weights); fp16 (GPU) uses DeepSpeed's fp16 mode and its
  dynamic loss scaler.
- Teacher: under ZeRO 1/2 parameters are replicated, so the teacher is a plain replicated module (under fp16 it
  averages the student's fp16 weights). Under ZeRO-3 it is a second DeepSpeed engine without optimizer: every
  parameter is partitioned exactly like the student's (same shape, same world size, no persistent parameters),
  gathered for its forward and freed after, and the EMA runs on the local fp32 partitions with no communication.
- Clipping: 'global' is DeepSpeed's gradient_clipping; 'per_param' (DINO) is done here on each rank's gradient
  fragments, whose squared norms are summed over ranks first.
- Frozen parameters cannot drop their gradients (they live in flat partitions): their gradient fragments are
  zeroed and their weights restored after the step. Moments that are zero stay zero, so DINO's frozen last layer
  gets no update and no optimizer state, as in the official code; only the Adam step count is per flat group, so
  once unfrozen its bias correction is that of the group.
- LARS and LAMB compute trust ratios per tensor, which DeepSpeed's flat partitions would turn into one ratio per
  partition: they are refused (use ddp or fsdp2).
- Checkpoints are DeepSpeed's own (`save_native` / `load_native`, DeepSpeed's calls only). ZeRO-1/2 checkpoints
  also resume on another world size, through DeepSpeed's universal checkpoint format (converted on first use);
  ZeRO-3 ones do not. The teacher's file and the buffers an elastic load needs are written and read by
  scale.checkpoint.state, which hands their tensors to `teacher_state` / `load_teacher_state` / `load_buffers`.
"""

import hashlib
import logging
import os
import shutil
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scale.engine.base import Engine
from scale.engine.ds_internals import (
    client_optimizer,
    convert_to_universal,
    deferred_write_errors,
    fp32_master_partitions,
    hp_fragment,
    lp_grad_fragment,
    share_fp32_master,
    universal_load,
    zero3_partition,
)
from scale.engine.ema import copy_student_to_teacher, ema_update
from scale.engine.guard import FiniteGuard
from scale.engine.materialize import is_meta, materialize
from scale.engine.parallel import ParallelContext
from scale.engine.parallelize import parallelize
from scale.engine.params import clean_name, named_parameters, nbytes
from scale.engine.precision import resolve_precision
from scale.engine.torch_engine import broadcast_module
from scale.errors import UserError, os_error
from scale.extras import require
from scale.methods.base import Method
from scale.optim import build_optimizer, keep_settings, param_groups, settings

DS_OPTIMIZERS = ("adamw", "sgd")
CHECKPOINT_TAG = "state"
COUNTERS = ("global_steps", "global_samples", "skipped_steps")  # what DeepSpeed's load sets besides tensors


def op_build_dir(prefix: str = sys.prefix) -> str:
    """Where DeepSpeed's just-in-time op builds go for this Python environment. torch's default,
    ~/.cache/torch_extensions/py311_cpu, is shared by every venv of the machine: each rebuilt the ops the other had
    built, and torch 2.11 waited forever on a lock file torch 2.14 had left there."""
    key = hashlib.sha256(f"{prefix}|{torch.__version__}".encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "scale" / "torch_extensions" / key)


def choose_accelerator(device_type: str | None = None) -> None:
    """Tell DeepSpeed its accelerator before it is first imported: it picks one at import and, on a machine
    without CUDA, logs "Setting accelerator to CPU ... unable to detect it" (the first line of `scale ckpt info`
    of a DeepSpeed checkpoint) and "No CUDA runtime is found". `device_type`: the run's device; None: CUDA if
    torch sees it. Never set on a GPU machine; a DS_ACCELERATOR already set wins."""
    if (device_type or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def quiet_deepspeed(device_type: str) -> None:
    """Keep DeepSpeed's noise that no user can act on off the console (`scale -v` shows it):
    - torch's cpp_extension, which DeepSpeed imports, logs "No CUDA runtime is found, using CUDA_HOME=..." at
      import on every rank of a CPU run on a machine with a CUDA toolkit: a CPU run builds no CUDA op;
    - ZeRO calls torch.distributed.all_gather_into_tensor / reduce_scatter_tensor, which torch 2.14 deprecates
      with a FutureWarning per rank: DeepSpeed's call, not scale's."""
    from scale.verbosity import verbose

    if verbose():
        return
    if device_type == "cpu":
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        category=FutureWarning,
    )


def import_deepspeed(device: torch.device):
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", op_build_dir())  # torch's cpp_extension reads it at each build
    choose_accelerator(device.type)
    quiet_deepspeed(device.type)
    deepspeed = require("deepspeed", "deepspeed", "engine.kind=deepspeed")
    skip_shared_memory_comm_build()
    return deepspeed


def skip_shared_memory_comm_build() -> None:
    """DeepSpeed's CPU accelerator compiles its shared-memory all-reduce op (g++: 45-90 s on 2 cores, once per
    environment, every rank waiting) when its comm backend starts, and prints that it did on every rank. The op
    serves `inference_all_reduce` (tensor-parallel inference) alone, which training never calls; marked incompatible
    (deepspeed.ops keeps that table to be edited), DeepSpeed communicates through torch.distributed, as it does where
    the op cannot build. Accelerators without the op are left as they are."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().get_op_builder("ShareMemCommBuilder")  # the class: only its NAME is needed
    if builder is not None:
        deepspeed.ops.__compatible_ops__[builder.NAME] = False


def ds_config(engine_cfg, optim_cfg, precision, with_optimizer: bool = True, hpz_size: int = 1) -> dict:
    """`hpz_size` > 1: ZeRO++ hierarchical partitioning, a secondary copy of the parameters sharded over groups of
    that many ranks (a node), from which the forward and backward all-gathers are served inside the group."""
    config = {
        # DeepSpeed only uses the micro-batch size for its own data loader and throughput logs; ours feeds it
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": engine_cfg.grad_accum,
        # no persistent (always gathered) ZeRO-3 parameters: the teacher's shards must be re-gathered after each
        # EMA update, and the student is partitioned exactly like it
        "zero_optimization": {"stage": engine_cfg.zero_stage, "stage3_param_persistence_threshold": 0},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if hpz_size > 1:
        config["zero_optimization"]["zero_hpz_partition_size"] = hpz_size
    if with_optimizer:
        config["zero_allow_untested_optimizer"] = True  # torch.optim.AdamW / SGD as client optimizers
        config["gradient_clipping"] = optim_cfg.clip_grad if optim_cfg.clip_mode == "global" else 0.0
        if precision.name == "fp16":
            power = engine_cfg.loss_scale_power
            config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": power, "auto_cast": True}
    return config


# how rank 0's conversion to the universal form went, as it tells the other ranks
CONVERTED, UNCONVERTIBLE, UNWRITABLE = 0, 1, 2


def universal_folder(folder: Path, group: dist.ProcessGroup | None, device: torch.device) -> Path:
    """DeepSpeed's universal form of the checkpoint in `folder` (`folder`/universal, converted by the group's rank 0
    on first use, through a temporary folder so that a kill leaves nothing half-written). A collective of `group`,
    which rank 0 ends by telling the others how the conversion went, so that a failure stops every rank instead of
    leaving them waiting: a file that cannot be written (a full disk) is a UserError (exit 2) said by rank 0 once,
    nothing loaded or deleted; any other failure (a damaged file) is raised on every rank, for the resume to try
    the previous checkpoint."""
    out, partial = folder / "universal", folder / "universal.partial"
    failed = None
    if dist.get_rank(group) == 0 and not out.exists():
        try:
            shutil.rmtree(partial, ignore_errors=True)  # what a killed conversion left
            convert_to_universal(folder / CHECKPOINT_TAG, partial / CHECKPOINT_TAG)
            os.replace(partial, out)
        except Exception as err:
            failed = err
            shutil.rmtree(partial, ignore_errors=True)
    verdict = CONVERTED if failed is None else UNWRITABLE if os_error(failed) is not None else UNCONVERTIBLE
    flag = torch.tensor([verdict], dtype=torch.int32, device=device)
    dist.broadcast(flag, group=group, group_src=0)  # also the barrier: the universal form is complete
    verdict = int(flag.item())
    if verdict == UNWRITABLE and failed is not None:
        raise UserError(
            f"{folder}: resuming on another number of ranks converts it to DeepSpeed's universal form beside it, "
            f"which could not be written ({os_error(failed)}). Free space there (about the checkpoint's size) or "
            f"resume on the number of ranks that wrote it; nothing was loaded or deleted."
        ) from None
    if verdict == UNWRITABLE:
        raise SystemExit(UserError.exit_code)  # rank 0 says why, once
    if failed is not None:
        raise failed
    if verdict == UNCONVERTIBLE:
        raise RuntimeError(f"{folder}: rank 0 could not convert it to DeepSpeed's universal form (its log says why)")
    return out


class DeepSpeedEngine(Engine):
    kind = "deepspeed"
    native_checkpoint = True
    checkpoint_tag = CHECKPOINT_TAG
    syncs_each_step = True

    def __init__(self, engine_cfg, optim_cfg, dist_info: ParallelContext, device: torch.device):
        if optim_cfg.name not in DS_OPTIMIZERS:
            raise UserError(
                f"optim.name={optim_cfg.name} computes per-tensor trust ratios, which DeepSpeed's flat "
                f"ZeRO partitions break: use {' or '.join(DS_OPTIMIZERS)}, or engine.kind=fsdp2/ddp"
            )
        self.cfg, self.optim_cfg, self.dist_info, self.device = engine_cfg, optim_cfg, dist_info, device
        self.precision = resolve_precision(engine_cfg.precision, device)
        self.stage = engine_cfg.zero_stage
        # hierarchical partitioning (ZeRO++ hpZ) only when the shard groups are smaller than the world
        self.hpz_size = dist_info.shard_size if dist_info.shard_size < dist_info.world_size else 1
        if self.hpz_size > 1 and self.stage != 3:
            raise UserError(
                f"engine.shard_size={engine_cfg.shard_size} with engine.kind=deepspeed needs engine.zero_stage=3 "
                f"(ZeRO++ hierarchical partitioning, zero_hpz_partition_size, partitions ZeRO-3 parameters only); "
                f"ZeRO-{self.stage} replicates the parameters anyway: drop engine.shard_size"
            )
        self.method: Method | None = None
        self.micro_step = 0

    # --- setup
    def setup(self, method: Method) -> None:
        self.deepspeed = deepspeed = import_deepspeed(self.device)
        deepspeed.init_distributed(dist_backend=dist.get_backend())  # joins our process group
        self.method = method
        meta = is_meta(method.student) or (method.teacher is not None and is_meta(method.teacher))
        modules = [m for m in (method.student, method.teacher) if m is not None]
        for module in modules:
            # DeepSpeed partitions existing tensors: a meta-built model is materialised whole on each rank first
            if meta:
                materialize(module, self.device)
            else:
                module.to(self.device)
            broadcast_module(module, self.dist_info.dp_group)
        if meta and method.teacher is not None:
            copy_student_to_teacher(method.teacher, method.student)
        parallelize(method, self.cfg, self.precision, self.dist_info, lambda: self.wrap(method))
        self.micro_step = 0

    def wrap(self, method: Method) -> None:
        """deepspeed.initialize over the student with its optimizer (ZeRO partitions it), and the teacher
        partitioned alike under ZeRO-3."""
        groups = param_groups(named_parameters(method.student), self.optim_cfg)
        client = build_optimizer(groups, self.optim_cfg, self.device, sharded=True)
        self.ds, self.optimizer, _, _ = self.deepspeed.initialize(
            model=method.student,
            optimizer=client,
            config=ds_config(self.cfg, self.optim_cfg, self.precision, hpz_size=self.hpz_size),
        )
        method.student = self.ds
        if self.stage == 3 and not self.precision.needs_loss_scaling:
            share_fp32_master(self.optimizer)
        if method.teacher is not None and self.stage == 3:
            method.teacher, _, _, _ = self.deepspeed.initialize(
                model=method.teacher, config=ds_config(self.cfg, self.optim_cfg, self.precision, False, self.hpz_size)
            )

    def autocast(self):
        return self.precision.autocast()

    # --- backward and step
    def backward(self, loss: torch.Tensor) -> None:
        with self.micro_batch():
            self.ds.backward(loss)  # divides by gradient_accumulation_steps, scales for fp16
        if self.micro_step < self.cfg.grad_accum:
            self.ds.step()  # DeepSpeed counts micro-batches in step(); it updates only at the boundary

    def step(self, frozen: Callable[[str], bool] | None = None, guard: FiniteGuard | None = None) -> dict:
        """DeepSpeed waits for the device in its own step (overflow check, gradient norm): the loop reads the
        guard before calling this (`syncs_each_step`), so a step that reaches here has a finite loss."""
        self.check_accumulated()
        named = [(clean_name(n), p) for n, p in self.ds.module.named_parameters() if p.requires_grad]
        grads = [self.local_grad(p) for _, p in named]
        metrics = {}
        if self.optim_cfg.clip_mode == "per_param":
            metrics["grad_norm"] = self.clip_per_param(grads)
        frozen_params = [(p, g) for (name, p), g in zip(named, grads) if frozen is not None and frozen(name)]
        saved = [self.snapshot(p) for p, _ in frozen_params]
        for _, grad in frozen_params:
            if grad is not None:
                grad.zero_()
        self.ds.step()
        for (param, _), weights in zip(frozen_params, saved):
            self.restore(param, weights)
        self.micro_step = 0
        if "grad_norm" not in metrics:
            norm = self.ds.get_global_grad_norm()
            metrics["grad_norm"] = float(norm) if norm is not None else float("nan")
        if self.precision.needs_loss_scaling:
            metrics["loss_scale"] = float(self.ds.optimizer.loss_scale)
        if guard is not None:
            guard.check_gradient(torch.as_tensor(metrics["grad_norm"], device=self.device))
            guard.check_update(self.held(self.ds.module))
        return metrics

    def local_grad(self, param: nn.Parameter) -> torch.Tensor | None:
        """This rank's fragment of the reduced gradient (a view the optimizer reads), None if it holds none."""
        if self.stage == 3:
            from deepspeed.utils import safe_get_local_grad

            return safe_get_local_grad(param)
        return lp_grad_fragment(param)

    def clip_per_param(self, grads: list[torch.Tensor | None]) -> float:
        """DINO's rule on fragments: full norms from all-reduced squared fragment norms (fp16: unscaled)."""
        sq = torch.zeros(len(grads), device=self.device, dtype=torch.float32)
        for i, g in enumerate(grads):
            if g is not None and g.numel():
                sq[i] = g.float().pow(2).sum()
        dist.all_reduce(sq, group=self.dist_info.dp_group)  # ZeRO partitions gradients over all data-parallel ranks
        scale = float(getattr(self.ds.optimizer, "loss_scale", 1.0)) if self.precision.needs_loss_scaling else 1.0
        norms = sq.sqrt() / scale
        clip = self.optim_cfg.clip_grad
        if clip > 0:
            for g, factor in zip(grads, (clip / (norms + 1e-6)).clamp(max=1.0).tolist()):
                if g is not None and factor < 1.0:
                    g.mul_(factor)
        return float(norms.pow(2).sum().sqrt())

    def snapshot(self, param: nn.Parameter) -> list[torch.Tensor]:
        """The tensors this rank holds for `param` that a step writes: model weights and fp32 master fragment."""
        if self.stage == 3:
            from deepspeed.utils import safe_get_local_fp32_param

            return [zero3_partition(param).detach().clone(), safe_get_local_fp32_param(param).detach().clone()]
        master = hp_fragment(param)
        return [param.data.detach().clone()] + ([] if master is None else [master.detach().clone()])

    def restore(self, param: nn.Parameter, held: list[torch.Tensor]) -> None:
        if self.stage == 3:
            from deepspeed.utils import safe_set_local_fp32_param

            zero3_partition(param).data.copy_(held[0])
            safe_set_local_fp32_param(param, held[1])
            return
        param.data.copy_(held[0])
        if len(held) > 1:
            hp_fragment(param).data.copy_(held[1])

    # --- teacher
    def ema(self, momentum: float, guard: FiniteGuard | None = None) -> None:
        if self.method.teacher is None:
            raise RuntimeError("ema() called but the method has no teacher")
        if guard is not None and guard.bad.item():  # DeepSpeed's step has waited for the device already
            return
        if self.stage < 3:
            ema_update(self.method.teacher, self.ds, momentum)
            return
        student = dict(self.partitions(self.ds, master=True))
        teacher_parts, student_parts = [], []
        for name, part in self.partitions(self.method.teacher):
            if name not in student:
                raise ValueError(f"teacher parameter '{name}' has no student counterpart")
            teacher_parts.append(part)
            student_parts.append(student[name].to(part.dtype))
        with torch.no_grad():
            torch._foreach_lerp_(teacher_parts, student_parts, 1.0 - momentum)

    @staticmethod
    def partitions(engine, master: bool = False) -> list[tuple[str, torch.Tensor]]:
        """ZeRO-3: each parameter's local partition, by unwrapped name; with `master`, the fp32 master partition
        of trainable low-precision (fp16) weights, so that the teacher averages fp32 weights."""
        from deepspeed.utils import safe_get_local_fp32_param

        parts = []
        for name, p in engine.module.named_parameters():
            part = zero3_partition(p)
            use_master = master and p.requires_grad and part.dtype != torch.float32
            parts.append((clean_name(name), safe_get_local_fp32_param(p) if use_master else part.data))
        return parts

    # --- accounting
    def memory(self) -> dict[str, int]:
        """Model weights held (ZeRO-3: partitions), gradients at their size after backward (ZeRO-1: whole,
        ZeRO-2/3: this rank's partition), optimizer = fp32 master partitions (when not the weights themselves, as
        they are in fp32 ZeRO-3) + the optimizer state."""
        zero = self.ds.optimizer
        master = fp32_master_partitions(zero, self.stage)
        weights = self.held(self.ds.module)
        weight_storages = {t.untyped_storage().data_ptr() for t in weights}
        separate_master = [m for m in master if m.untyped_storage().data_ptr() not in weight_storages]
        # the client torch optimizer's state over DeepSpeed's flat fp32 partitions
        state = sum(nbytes(v) for s in client_optimizer(zero).state.values() for v in s.values() if torch.is_tensor(v))
        trainable = [p for p in self.ds.module.parameters() if p.requires_grad]
        grads = sum(p.numel() for p in trainable) * 4 if self.stage == 1 else sum(nbytes(m) for m in master)
        teacher = self.held(self.teacher_module()) if self.method.teacher is not None else []
        report = {
            "params": sum(nbytes(t) for t in weights),
            "grads": grads,
            "optimizer": sum(nbytes(m) for m in separate_master) + state,
            "teacher": sum(nbytes(t) for t in teacher),
            "lowp": 0,  # DeepSpeed casts inside its own engine (bf16/fp16 weights are `params`)
        }
        report["total"] = sum(report.values())
        return report

    def held(self, module: nn.Module) -> list[torch.Tensor]:
        """The weight tensors this rank holds: ZeRO-3 partitions, whole parameters otherwise."""
        return [zero3_partition(p) if self.stage == 3 else p.data for p in module.parameters()]

    def teacher_module(self) -> nn.Module:
        return self.method.teacher.module if self.stage == 3 else self.method.teacher

    # --- checkpoints (DeepSpeed's format; same world size)
    def save_native(self, folder) -> None:
        """Collective. A file this rank cannot write (a full disk) raises its OSError only after DeepSpeed's own
        collectives are done, so that the ranks can agree to stop (scale.checkpoint.checkpointer); the caller's
        agreement is also the barrier after the writes."""
        folder = Path(folder)
        with deferred_write_errors(self.ds) as failed:
            # universal_checkpoint_info keeps DeepSpeed's ds_to_universal conversion (other world sizes) possible;
            # no `latest` file: the loads name the tag
            self.ds.save_checkpoint(
                str(folder),
                tag=CHECKPOINT_TAG,
                client_state={"universal_checkpoint_info": {}},
                save_latest=False,
            )
        if failed:
            raise failed[0]

    def load_native(self, folder, saved_world_size: int, optimizer: bool = True) -> None:
        """On the saving world size, DeepSpeed's own load; on another (ZeRO-1/2), through its universal checkpoint
        format, converted once beside the checkpoint. `optimizer` False: the optimizer keeps its fresh state.
        The checkpointer has checked that the checkpoint fits this model (scale.checkpoint.resume) and rolls a load
        that fails half-way back (`rollback_point`)."""
        folder = Path(folder)
        elastic = saved_world_size != self.dist_info.world_size
        if elastic and self.stage == 3:
            raise UserError(
                f"{folder}: a ZeRO-3 checkpoint from {saved_world_size} ranks cannot be resumed exactly on "
                f"{self.dist_info.world_size} (DeepSpeed's universal load restores weights and moments, yet the "
                f"next update differs from the uninterrupted run's). Resume on {saved_world_size} ranks, or train "
                f"with engine.kind=fsdp2, whose checkpoints load on any number of ranks."
            )
        recipe = settings(client_optimizer(self.ds.optimizer))
        source = universal_folder(folder, self.dist_info.dp_group, self.device) if elastic else folder
        with universal_load(self.ds, elastic):
            path, _ = self.ds.load_checkpoint(
                str(source), tag=CHECKPOINT_TAG, load_optimizer_states=optimizer, load_lr_scheduler_states=optimizer
            )
        # the load copied the saved groups' settings (ZeRO-3's universal load: the first group's onto all)
        keep_settings(client_optimizer(self.ds.optimizer), recipe)
        if path is None:
            raise UserError(f"{folder}: no DeepSpeed checkpoint (tag '{CHECKPOINT_TAG}') found")

    def rollback_point(self, moments: bool = False) -> tuple[list, Callable[[], None]]:
        """What a load writes into, for scale.checkpoint.state.rolled_back: the weights and buffers this rank
        holds, the fp32 masters, the teacher (copied there); and a function putting back the inner optimizer's
        state tensors and groups, kept by reference, which costs no memory: every load of the checkpoints this
        engine writes puts new ones in place (torch's Optimizer.load_state_dict, the universal loads' new buffers),
        and ZeRO-3's load appends to the groups' `params` lists; and DeepSpeed's step counters. `moments`: the
        checkpoint is a ZeRO-1/2 one in DeepSpeed's `elastic_checkpoint` form (never written here), whose load
        copies into the live moments: they are copied too."""
        masters = fp32_master_partitions(self.ds.optimizer, self.stage)
        live = [self.held(self.ds.module), list(self.ds.module.buffers()), list(masters)]
        if self.method.teacher is not None:
            live.append(self.teacher_state())
        inner = client_optimizer(self.ds.optimizer)
        if moments:
            live.append([v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)])
        state = {p: dict(s) for p, s in inner.state.items()}  # the loads set keys of these dicts: shallow copies
        counters = {name: getattr(self.ds, name) for name in COUNTERS}
        groups = inner.param_groups
        kept_groups = [{k: list(v) if k == "params" else v for k, v in g.items()} for g in groups]

        def undo() -> None:
            inner = client_optimizer(self.ds.optimizer)
            inner.state = defaultdict(dict, state)
            inner.param_groups = groups
            for group, kept in zip(groups, kept_groups):
                group.clear()
                group.update(kept)
            for name, value in counters.items():
                setattr(self.ds, name, value)

        return live, undo

    def load_buffers(self, saved: dict[str, torch.Tensor], source) -> None:
        """The universal format carries parameters only: buffers (BatchNorm statistics) come from rank 0's model
        states (`saved`, read from `source` by scale.checkpoint.state), as DCP keeps one copy of replicated
        buffers."""
        with torch.no_grad():
            for name, buffer in self.ds.module.named_buffers():
                if name not in saved:
                    raise UserError(f"{source}: no entry for buffer '{name}'")
                buffer.copy_(saved[name])

    def teacher_state(self) -> dict[str, torch.Tensor]:
        module = self.teacher_module()
        if self.stage == 3:  # local partitions + (replicated) buffers
            return {
                **dict(self.partitions(self.method.teacher)),
                **{clean_name(n): b for n, b in module.named_buffers()},
            }
        return module.state_dict()

    def load_teacher_state(self, saved: dict[str, torch.Tensor], source) -> None:
        """Copy `saved` (the teacher_state() of the run that saved, read from `source`) into the teacher."""
        with torch.no_grad():
            for key, tensor in self.teacher_state().items():
                if key not in saved:
                    raise UserError(f"{source}: no entry for teacher '{key}'")
                tensor.copy_(saved[key])

    def export_state_dict(self, which: str = "teacher") -> dict[str, torch.Tensor]:
        module = {"teacher": self.teacher_module, "student": lambda: self.ds.module}[which]()
        if self.stage == 3:
            with self.deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                state = {clean_name(k): v.detach().cpu().clone() for k, v in module.state_dict().items()}
        else:
            state = {clean_name(k): v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return state if self.dist_info.is_main else {}

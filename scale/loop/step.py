"""The training step, built once: the training loop, `scale bench` and the memory report build it here and run
the same `TrainStep.__call__`.

The host never waits for the device inside a step: metrics stay tensors on the device (`read_record` copies them
to the host, on log steps), the non-finite check is a flag on the device that the optimizer step and the EMA
honour (scale.engine.guard), read by the loop on log steps and before checkpoints.
"""

import contextlib
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from scale.checkpoint.init import load_init_weights
from scale.data.batch import Batch, split_batch
from scale.data.prefetch import prefetch_to_device
from scale.engine import build_engine
from scale.engine.base import Engine, no_phase
from scale.engine.compile import begin_graph_step, replays_cuda_graphs
from scale.engine.dist import seed_everything
from scale.engine.guard import FiniteGuard
from scale.engine.kinds import runs_as
from scale.engine.parallel import ParallelContext
from scale.loop.monitors import Monitors
from scale.methods import build_method
from scale.methods.base import StepContext
from scale.optim import apply_schedule
from scale.schedules import lr_schedule, wd_schedule


class TrainStep:
    """Everything one step uses, built in this order: seeded RNGs, the loader, the method, the engine with the
    method's modules set up (`init_weights` loaded into them when given), the schedules, the monitors and the
    non-finite guard. On CUDA the loader is wrapped to copy the next batch ahead (scale.data.prefetch,
    data.prefetch_to_device); `self.loader` is what the checkpointer and the logs read.
    `max_schedule_steps_per_epoch` caps the steps per epoch the schedules cover (scale.bench: its small batches
    would make ImageNet-long schedule arrays). `phase` is entered around the parts of every step
    (forward, backward, guard, metrics, ema; the engine's step enters clip, guard and optimizer): scale.bench sets
    a timer or an op counter. `make_engine(engine_cfg, optim_cfg, info, device)`
    builds the engine: the recipe's (`build_engine`), or the planner's trace on fake tensors (scale.bench.trace)."""

    def __init__(
        self,
        cfg: DictConfig,
        info: ParallelContext,
        device: torch.device,
        make_loader: Callable[[], object],
        init_weights: str = "",
        max_schedule_steps_per_epoch: int | None = None,
        phase: Callable[[str], contextlib.AbstractContextManager] = no_phase,
        make_engine: Callable[..., Engine] = build_engine,
    ):
        self.cfg, self.info, self.device, self.phase = cfg, info, device, phase
        seed_everything(cfg.train.seed, info.rank)
        self.loader = make_loader()
        self.steps_per_epoch = self.loader.steps_per_epoch
        if max_schedule_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, max_schedule_steps_per_epoch)
        self.total_steps = cfg.train.epochs * self.steps_per_epoch
        # train.init_weights loads into a meta-device build once FSDP2 has sharded it; where fsdp2 runs as DDP
        # (scale.engine.kinds.runs_as: one rank per shard group, which holds the whole net anyway) the nets are built
        # off the meta device and loaded before the engine wraps them, as DDP's are
        ran = runs_as(cfg.engine.kind, info.world_size, info.shard_size, cfg.engine.unsharded_ddp)
        meta = cfg.engine.meta_init and not (init_weights and ran != "fsdp2")
        self.method = build_method(
            cfg,
            self.steps_per_epoch,
            self.total_steps,
            device="meta" if meta else None,
            dp_group=info.dp_group,
        )
        self.engine = make_engine(cfg.engine, cfg.optim, info, device)
        self.engine.phase = phase
        if init_weights and not meta:
            load_init_weights(self.nets(), init_weights, cfg.train.init_what, sharded=False)
        self.engine.setup(self.method)
        if init_weights and meta:
            load_init_weights(self.nets(), init_weights, cfg.train.init_what, sharded=True)
        self.lr = lr_schedule(cfg.optim, cfg.train.global_batch, self.steps_per_epoch, self.total_steps)
        self.weight_decay = wd_schedule(cfg.optim, self.total_steps)
        self.monitors = Monitors(cfg, device, info.dp_group)
        self.guard = FiniteGuard(device, info.dp_group)
        self.graph_steps = replays_cuda_graphs(cfg.engine)
        loader = self.loader
        self.loader = prefetch_to_device(loader, device, cfg.data.prefetch_to_device, self.method.check_batch)
        self.prefetched = self.loader is not loader

    def modules(self) -> list:
        return [m for m in (self.method.student, self.method.teacher) if m is not None]

    def nets(self) -> dict:
        return {"student": self.method.student, "teacher": self.method.teacher}

    def batches(self):
        """Batches across epochs: the loader yields one epoch per iteration, from its saved position."""
        while True:
            yield from self.loader

    def next_batch(self, batches) -> tuple[Batch, float]:
        start = time.perf_counter()
        batch = next(batches)
        # a prefetcher has checked it on the host and copied it already; a synthetic batch is made on the device
        if not self.prefetched and not getattr(self.loader, "on_device", False):
            self.method.check_batch(batch)
            batch = batch.to(self.device)
        return batch, time.perf_counter() - start

    def context(self, step: int, log: bool = True) -> StepContext:
        return StepContext(
            step=step,
            epoch=step // self.steps_per_epoch,
            steps_per_epoch=self.steps_per_epoch,
            total_steps=self.total_steps,
            log=log,
        )

    def __call__(self, step: int, batch: Batch, log: bool = True) -> dict:
        """One optimizer step over `batch` (split into engine.grad_accum micro-batches). Returns the step's
        record; its tensor values are read on the host by `read_record`. `log`: the record will be read (a log
        step): only then are the monitors computed that nothing but the record reads (teacher entropy and KL,
        the embeddings' spread)."""
        if self.graph_steps:
            begin_graph_step()
        ctx = self.context(step, log)
        lr, wd = self.lr(step), self.weight_decay(step)
        apply_schedule(self.engine.optimizer.param_groups, lr, wd)
        self.guard.begin(step)
        started = time.perf_counter()
        totals: dict = {}
        losses = []
        micro_batches = split_batch(batch, self.cfg.engine.grad_accum)
        for micro in micro_batches:
            with self.phase("forward"), self.engine.autocast():
                loss, metrics = self.method.loss(micro, ctx)
            losses.append(loss.detach())
            with self.phase("backward"):
                self.engine.backward(loss)
            with self.phase("metrics"):
                for key, value in {"loss": loss.detach(), **metrics}.items():
                    # the mean over micro-batches (one micro-batch: the value itself, no launch)
                    share = value / len(micro_batches) if len(micro_batches) > 1 else value
                    totals[key] = totals[key] + share if key in totals else share
        # any rank's non-finite loss: no update (on the device, or read here by an engine whose step waits anyway)
        with self.phase("guard"):
            self.guard.check_loss(losses)
            if self.engine.syncs_each_step and self.guard.bad.item():
                raise NonFiniteStep()
        with self.phase("metrics"):
            totals.update(self.monitors.after_backward(step, self.method.student))  # gradients are zeroed by the step
        totals.update(self.engine.step(self.method.frozen_params(ctx), self.guard))  # enters clip/guard/optimizer
        momentum = self.method.ema_momentum(ctx)
        if momentum is not None:
            with self.phase("ema"):
                self.engine.ema(momentum, self.guard)
        step_time = time.perf_counter() - started
        with self.phase("metrics"):
            totals.update(self.monitors.after_step(step, self.method.monitor_features, batch.labels, log))
        return {
            **totals,
            "lr": lr,
            "weight_decay": wd,
            "epoch": ctx.epoch,
            "step_time_s": step_time,
            "images_per_s": self.cfg.train.global_batch / step_time,
            **({"teacher_momentum": momentum} if momentum is not None else {}),
        }


class NonFiniteStep(Exception):
    """Raised inside a step by engines that read the guard on the host each step; the loop reads the guard and
    stops the run with its message."""


def read_record(record: dict, group: dist.ProcessGroup | None = None) -> dict:
    """The record with its tensors read on the host: one copy for all of them (a log step's only wait). With the
    data-parallel `group` (the parallel context's dp_group), each tensor figure is the mean over its ranks, so that
    the loss and the other per-batch figures mean the same at any world size (rank 0's own differed from the
    run's by its share of the batch). A collective of `group`: every rank calls it on the same (log) steps, with
    the same tensor keys (the step's code paths depend on the step and the recipe only)."""
    names = [k for k, v in record.items() if torch.is_tensor(v)]
    if not names:
        return dict(record)
    device = record[names[0]].device
    values = torch.stack([record[k].detach().float().reshape(()).to(device) for k in names])
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(values, group=group)  # a sum: gloo has no ReduceOp.AVG
        values /= dist.get_world_size(group)
    return {**record, **dict(zip(names, values.cpu().tolist()))}

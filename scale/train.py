"""The training loop: the only place that sees the data, the method, the engine and the checkpoints together."""

import contextlib
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from scale.checkpoint import Checkpointer, CheckpointStore
from scale.checkpoint.init import load_backbone_weights
from scale.config import load_recipe
from scale.config.validate import check_launch
from scale.data.batch import split_batch
from scale.data.factory import build_loader
from scale.engine import build_engine
from scale.engine.dist import DistInfo, detect, init_distributed, seed_everything, shutdown
from scale.engine.parallel import ParallelContext, parallel_context
from scale.errors import PREEMPTED_EXIT_CODE, NonFiniteLoss, UserError
from scale.eval.classify import Validation
from scale.faults import maybe_inject
from scale.launch.local import already_launched, spawn
from scale.methods import build_method, has_class_head
from scale.methods.base import StepContext
from scale.monitors import Monitors
from scale.optim import apply_schedule
from scale.preemption import Preemption
from scale.progress import progress_bar
from scale.resume import check_resumable
from scale.rundir import MetricsWriter, RunDir, setup_logging
from scale.schedules import lr_schedule, wd_schedule

log = logging.getLogger(__name__)


def main(recipe: str, overrides: list[str], run_dir: str | None = None, nproc: int = 0) -> int:
    cfg = load_recipe(recipe, overrides)  # validate before spawning anything
    run = RunDir(run_dir or Path("runs") / cfg.meta.name)
    spawning = nproc > 1 and not already_launched()
    check_launch(cfg, nproc if spawning else detect().world_size)
    run.check_writable()
    check_resumable(run, cfg)
    if spawning:
        return spawn(nproc, ["train", recipe, *overrides, "--run-dir", str(run.root)])
    info, device = init_distributed()
    try:
        return Trainer(cfg, run, parallel_context(info, device, cfg.engine.shard_size), device).fit()
    finally:
        shutdown()


def prepare_run_dir(cfg: DictConfig, run: RunDir, info: DistInfo) -> None:
    """Rank 0 checks that an existing run can continue with this config, then (re)writes config.yaml."""
    if info.is_main:
        check_resumable(run, cfg)
        run.create()
        run.write_config(cfg)
    if dist.is_initialized():
        dist.barrier()


def train_loader(cfg: DictConfig, info: ParallelContext):
    """This rank's loader over the recipe's training shards: its share among the data-parallel ranks."""
    return build_loader(
        cfg.data,
        "train",
        cfg.train.global_batch,
        info.dp_rank,
        info.dp_size,
        seed=cfg.train.seed,
        samples_per_epoch=cfg.train.samples_per_epoch,
    )


def no_phase(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


class Trainer:
    # entered around the forward, backward and optimizer parts of every step; scale.bench sets a timer
    phase = staticmethod(no_phase)

    def __init__(self, cfg: DictConfig, run: RunDir, info: ParallelContext, device: torch.device):
        self.cfg, self.run, self.info, self.device = cfg, run, info, device
        prepare_run_dir(cfg, run, info)
        setup_logging(run, info.rank)
        self.validation = (
            Validation(cfg, info, device, run.root / "eval" / "val.json")  # checks data.val at once
            if has_class_head(cfg) and cfg.train.val_every_epochs > 0
            else None
        )
        fresh = not CheckpointStore(run.checkpoints).candidates()
        self.build_step(lambda: train_loader(cfg, info), init_weights=cfg.train.init_weights if fresh else "")
        self.checkpointer = Checkpointer(
            run.checkpoints, cfg, info, self.engine, self.method, self.loader, self.monitors
        )
        self.metrics = MetricsWriter(run, info.is_main)
        self.preemption = Preemption(list(cfg.train.preempt_signals), info.dp_group)

    def build_step(
        self, make_loader: Callable[[], object], init_weights: str = "", max_schedule_steps_per_epoch: int | None = None
    ) -> None:
        """Everything `train_step` uses, in this order: seeded RNGs, the loader, the method, the engine with the
        method's modules set up (`init_weights` loaded into them when given), the schedules and the monitors.
        scale.bench builds its trainer through here too, so that it measures the step as training sets it up; it
        caps the steps per epoch the schedules cover with `max_schedule_steps_per_epoch`."""
        cfg, info = self.cfg, self.info
        seed_everything(cfg.train.seed, info.rank)
        self.loader = make_loader()
        self.steps_per_epoch = self.loader.steps_per_epoch
        if max_schedule_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, max_schedule_steps_per_epoch)
        self.total_steps = cfg.train.epochs * self.steps_per_epoch
        self.method = build_method(
            cfg,
            self.steps_per_epoch,
            self.total_steps,
            device="meta" if cfg.engine.meta_init else None,
            dp_group=info.dp_group,
        )
        self.engine = build_engine(cfg.engine, cfg.optim, info, self.device)
        if init_weights and not cfg.engine.meta_init:
            load_backbone_weights(self._modules(), init_weights, sharded=False)
        self.engine.setup(self.method)
        if init_weights and cfg.engine.meta_init:
            if cfg.engine.kind != "fsdp2":
                raise UserError("train.init_weights with engine.meta_init needs engine.kind=fsdp2")
            load_backbone_weights(self._modules(), init_weights, sharded=True)
        self.lr = lr_schedule(cfg.optim, cfg.train.global_batch, self.steps_per_epoch, self.total_steps)
        self.weight_decay = wd_schedule(cfg.optim, self.total_steps)
        self.monitors = Monitors(cfg, self.device, info.dp_group)

    def _modules(self) -> list:
        return [m for m in (self.method.student, self.method.teacher) if m is not None]

    def ckpt_every(self) -> int:
        return self.cfg.train.ckpt_every_steps or self.steps_per_epoch

    def stop_step(self) -> int:
        max_steps = self.cfg.train.max_steps
        return self.total_steps if max_steps is None else min(self.total_steps, max_steps)

    def fit(self) -> int:
        start = self.checkpointer.resume()
        stop = self.stop_step()
        log.info(
            "training %s: steps %d..%d of %d (%d per epoch), world size %d (%s), engine %s",
            self.cfg.meta.name,
            start,
            stop,
            self.total_steps,
            self.steps_per_epoch,
            self.info.world_size,
            self.info.describe(),
            self.cfg.engine.kind,
        )
        batches = self._batches()
        bar = progress_bar(total=stop, initial=start, enabled=self.info.is_main, desc="train")
        try:
            for step in range(start, stop):
                batch, data_wait = self._next_batch(batches)
                record = self.train_step(step, batch)
                record["data_wait_s"] = data_wait
                done = step + 1
                if self.validation and self.validation.due(done, stop, self.steps_per_epoch):
                    record.update(self.validation(self.method, self.engine.autocast, done, done / self.steps_per_epoch))
                self._log(step, record)
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}")
                maybe_inject("step", done)
                maybe_inject("preempt", done)
                if self.preemption.requested():
                    self.checkpointer.save(done)
                    return PREEMPTED_EXIT_CODE
                if done % self.ckpt_every() == 0 and done != stop:
                    self.checkpointer.save(done)
            if start < stop or not self.checkpointer.has(stop):
                self.checkpointer.save(stop)
        finally:
            bar.close()
            self.metrics.close()
            self.checkpointer.close()
        log.info("finished at step %d; run directory %s", stop, self.run.root)
        return 0

    def _batches(self):
        """Batches across epochs: the loader yields one epoch per iteration, from its saved position."""
        while True:
            yield from self.loader

    def _next_batch(self, batches):
        start = time.perf_counter()
        batch = next(batches)
        batch = batch.to(self.device)
        return batch, time.perf_counter() - start

    def train_step(self, step: int, batch) -> dict:
        ctx = StepContext(
            step=step,
            epoch=step // self.steps_per_epoch,
            steps_per_epoch=self.steps_per_epoch,
            total_steps=self.total_steps,
        )
        lr, wd = self.lr(step), self.weight_decay(step)
        apply_schedule(self.engine.optimizer.param_groups, lr, wd)
        started = time.perf_counter()
        totals: dict[str, float] = {}
        micro_batches = split_batch(batch, self.cfg.engine.grad_accum)
        for micro in micro_batches:
            with self.phase("forward"), self.engine.autocast():
                loss, metrics = self.method.loss(micro, ctx)
            self._check_finite(loss, step, micro)
            with self.phase("backward"):
                self.engine.backward(loss)
            for key, value in {"loss": loss.item(), **metrics}.items():
                totals[key] = totals.get(key, 0.0) + float(value) / len(micro_batches)
        totals.update(self.monitors.after_backward(step, self.method.student))  # gradients are zeroed by the step
        with self.phase("optimizer"):
            totals.update(self.engine.step(self.method.frozen_params(ctx)))
            momentum = self.method.ema_momentum(ctx)
            if momentum is not None:
                self.engine.ema(momentum)
        step_time = time.perf_counter() - started
        totals.update(self.monitors.after_step(step, self.method.monitor_features, batch.labels))
        return {
            **totals,
            "lr": lr,
            "weight_decay": wd,
            "epoch": ctx.epoch,
            "step_time_s": step_time,
            "images_per_s": self.cfg.train.global_batch / step_time,
            **({"teacher_momentum": momentum} if momentum is not None else {}),
        }

    def _check_finite(self, loss: torch.Tensor, step: int, batch) -> None:
        """Every rank learns whether any rank's loss is non-finite, before any update is applied."""
        bad = torch.tensor([0.0 if math.isfinite(loss.item()) else 1.0], device=self.device)
        if self.info.dp_group is not None:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=self.info.dp_group)
        if bad.item():
            keys = ", ".join(batch.keys[:4]) + (" ..." if len(batch.keys) > 4 else "")
            raise NonFiniteLoss(
                f"non-finite loss at step {step} (rank {self.info.rank}: {loss.item()}; samples {keys}). Nothing "
                f"was updated; the last checkpoint in {self.run.checkpoints} is clean. See README "
                f"'Troubleshooting: NaN loss' (fp16 with small patches, lr, teacher temperature)."
            )

    def _log(self, step: int, record: dict) -> None:
        every = self.cfg.train.log_every
        if (step + 1) % every and step + 1 != self.stop_step() and step != 0 and "val_top1" not in record:
            return
        record.update(self.loader.metrics())
        self.metrics.write(step + 1, record)

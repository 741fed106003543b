"""The training loop: the only place that sees the data, the method, the engine and the checkpoints together."""

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from scale.checkpoint import Checkpointer
from scale.checkpoint.diskspace import check_before_save, check_start, quiet_full_disk_in_threads, weights_bytes
from scale.checkpoint.init import check_init_weights
from scale.checkpoint.resume import Start, read_start
from scale.checkpoint.state import run_states
from scale.checkpoint.store import epochs_done
from scale.config import load_recipe
from scale.config.validate import check_launch
from scale.data.factory import build_loader
from scale.data.loader import global_metrics
from scale.data.spec import LoaderSpec
from scale.engine.dist import detect, shutdown
from scale.engine.kinds import describe as describe_engine
from scale.engine.parallel import ParallelContext, init_parallel
from scale.errors import PREEMPTED_EXIT_CODE, NonFiniteLoss
from scale.faults import maybe_inject
from scale.launch.local import CHECKED, LAUNCH_MARK, already_launched, spawn
from scale.loop.cadence import Cadence, StepPlan
from scale.loop.preemption import Preemption
from scale.loop.rundir import RunDir, setup_logging
from scale.loop.runlock import RunLock
from scale.loop.runlock import hold as hold_run_lock
from scale.loop.step import NonFiniteStep, TrainStep, read_record
from scale.loop.validation import Validation, check_val_data
from scale.methods import has_class_head
from scale.progress import progress_bar
from scale.trackers import Trackers, check_stores, check_trackers
from scale.watch.collapse import CollapseAlarm
from scale.watch.heartbeat import Heartbeat

log = logging.getLogger(__name__)


def main(recipe: str, overrides: list[str], run_dir: str | None = None, nproc: int = 0, synthetic: bool = False) -> int:
    """`synthetic`: random batches of the recipe's crop layout instead of its shards (scale.data.synthetic, as
    `scale bench --synthetic-data`), no validation: a smoke run of the engine, the collectives, checkpointing and
    resume on a new cluster before any data is there."""
    trusted = os.environ.get(CHECKED) == "1"  # a rank whose launcher ran the start-up checks for the whole launch
    cfg = load_recipe(recipe, overrides, validate=not trusted)  # validated before spawning anything
    run = RunDir(run_dir or Path("runs") / cfg.meta.name)
    spawning = nproc > 1 and not already_launched()
    if not trusted:
        check_launch(cfg, nproc if spawning else detect().world_size, data=not synthetic)
        check_trackers(cfg)
        run.check_writable()
        check_stores(cfg, run.root)  # the trackers' stores, once the run directory is checked
    start = read_start(run, cfg)
    if not trusted:
        startup_checks(cfg, run, start, synthetic)
    if spawning:
        flags = ["--synthetic-data"] if synthetic else []
        with RunLock(run.root) as lock:  # the ranks inherit it
            fds = () if lock.fd is None else (lock.fd,)
            argv = ["train", recipe, *overrides, "--run-dir", str(run.root), *flags]
            return spawn(nproc, argv, pass_fds=fds, env={CHECKED: "1"})
    quiet_full_disk_in_threads()
    own_launcher = not already_launched()  # before init_parallel, which sets torchrun's variables for one process
    try:
        context, device = init_parallel(cfg.engine.shard_size)
        with hold_run_lock(run.root, context.dp_group, inherited=LAUNCH_MARK in os.environ):
            return Trainer(cfg, run, context, device, synthetic, start, own_launcher).fit()
    finally:
        shutdown()


def startup_checks(cfg: DictConfig, run: RunDir, start: "Start", synthetic: bool) -> None:
    """What a launch checks once before any rank starts (the disk, the weights to initialise from, the validation
    data): the launcher of `--nproc`, or each process under torchrun or srun."""
    check_start(run.checkpoints, run.root)
    if cfg.train.init_weights and start.fresh:
        check_init_weights(cfg)
    if validates(cfg, synthetic):
        check_val_data(cfg)


def validates(cfg: DictConfig, synthetic: bool = False) -> bool:
    """Whether the run reports validation accuracy (a method with a class head, train.val_every_epochs > 0, real
    data)."""
    return has_class_head(cfg) and cfg.train.val_every_epochs > 0 and not synthetic


def prepare_run_dir(cfg: DictConfig, run: RunDir, info: ParallelContext) -> None:
    """Rank 0 (re)writes config.yaml, once `read_start` has checked that the run can continue with it."""
    if info.is_main:
        run.create()
        run.write_config(cfg)
    if dist.is_initialized():
        dist.barrier()


def train_loader(cfg: DictConfig, info: ParallelContext, device: torch.device):
    """This rank's loader over the recipe's training shards: its share among the data-parallel ranks, in pinned
    memory for a CUDA device."""
    return build_loader(
        LoaderSpec(
            cfg.data,
            "train",
            cfg.train.global_batch,
            info.dp_rank,
            info.dp_size,
            seed=cfg.train.seed,
            samples_per_epoch=cfg.train.samples_per_epoch,
            pin_memory=device.type == "cuda",
        )
    )


def synthetic_loader(cfg: DictConfig, info: ParallelContext):
    """This rank's random batches in the recipe's crop layout (`scale train --synthetic-data`)."""
    from scale.data.synthetic import SyntheticLoader

    log.info("synthetic data: random batches of the recipe's crop layout, no shards read, no validation")
    return SyntheticLoader(cfg, info.dp_rank, info.dp_size)


class Trainer:
    def __init__(
        self,
        cfg: DictConfig,
        run: RunDir,
        info: ParallelContext,
        device: torch.device,
        synthetic: bool = False,
        start: Start | None = None,
        own_launcher: bool = False,
    ):
        """`synthetic`: random batches instead of the recipe's shards (scale.data.synthetic). `start`: what `main`
        read of the run directory; read here when not given (a Trainer built without `main`). `own_launcher`: no
        launcher started this process (scale.loop.preemption.OWN_LAUNCHER_SIGNALS)."""
        start = start or read_start(run, cfg)
        self.cfg, self.run, self.info, self.device = cfg, run, info, device
        prepare_run_dir(cfg, run, info)
        setup_logging(run, info.rank)
        for change in start.notes if info.is_main else []:
            log.warning("resuming with a changed setting (allowed, see docs/how-to/resume.md): %s", change)
        validation = validates(cfg, synthetic)
        self.validation = Validation(cfg, info, device, run.root / "eval" / "val.json") if validation else None
        self.heartbeat = Heartbeat(run.root, info.is_main)
        self.step = TrainStep(
            cfg,
            info,
            device,
            (lambda: synthetic_loader(cfg, info)) if synthetic else (lambda: train_loader(cfg, info, device)),
            init_weights=cfg.train.init_weights if start.fresh else "",
            phase=self.heartbeat.phase_of,
        )
        self.engine, self.method, self.loader = self.step.engine, self.step.method, self.step.loader
        self.steps_per_epoch, self.total_steps = self.step.steps_per_epoch, self.step.total_steps
        states = run_states(self.method, self.loader, self.step.monitors, info, cfg.train.seed)
        self.checkpointer = Checkpointer(run.checkpoints, cfg, info, self.engine, states)
        self.collapse = CollapseAlarm(cfg, self.steps_per_epoch, self.method.teacher_classes, info.dp_group)
        self.preemption = Preemption(list(cfg.train.preempt_signals), info.dp_group, own_launcher)
        self.cadence = Cadence.of(cfg.train, self.steps_per_epoch, self.total_steps, validation)
        self.unread_keys: dict[int, list[str]] = {}  # this rank's sample keys of the steps since the guard's last read

    def fit(self) -> int:
        """Train from the resumed step to the cadence's stop: after each step, what `self.cadence` plans for it,
        in its order (scale.loop.cadence: every rank makes the same collective calls at the same steps)."""
        start = self.begin()
        batches = self.step.batches()
        plan, ended = None, "stopped"
        try:
            for step in range(start, self.cadence.stop):
                plan = self.cadence.at(step)  # before the step: a logged step also computes what is logged
                record = self.train_step(step, batches, log=plan.log)
                self.report(step, plan, record)
                maybe_inject("step", plan.done)
                maybe_inject("preempt", plan.done)
                if plan.check_preemption and self.preemption.requested():  # the verdict agreed by every rank
                    plan = self.cadence.at(step, preempted=True)
                if plan.save:
                    self.save(plan.done)
                if plan.stop:
                    break
            if plan is None and not self.checkpointer.has(self.cadence.stop):  # no step to run, the end unsaved
                self.check_finite()
                self.save(self.cadence.stop)
            ended = "preempted" if plan is not None and plan.preempted else "finished"
        finally:
            self.end(ended)
        if ended == "preempted":
            return PREEMPTED_EXIT_CODE
        log.info("finished at step %d; run directory %s", self.cadence.stop, self.run.root)
        return 0

    def begin(self) -> int:
        """Resume (the steps done so far: the first step index to run), open the trackers and the progress bar."""
        start = self.checkpointer.resume()
        # opened after the resume: a rollback or reset continues in new tracker runs (docs/how-to/trackers.md)
        self.metrics = Trackers(
            self.cfg, self.run.root, self.info.is_main, branch_at=start if self.checkpointer.steered else None
        )
        stop = self.cadence.stop
        log.info(
            "training %s: steps %d..%d of %d (%d per epoch), world size %d (%s), engine %s",
            self.cfg.meta.name,
            start,
            stop,
            self.total_steps,
            self.steps_per_epoch,
            self.info.world_size,
            self.info.describe(),
            describe_engine(self.cfg.engine.kind, self.engine.kind, self.info.world_size),
        )
        self.resumed_at = start or None  # marked on the first logged line (the report's loss plot shows it)
        self.bar = progress_bar(total=stop, initial=start, enabled=self.info.is_main, desc="train")
        self.heartbeat.bar = self.bar if self.info.is_main else None
        return start

    def train_step(self, step: int, batches, log: bool) -> dict:
        """One step over the next batch; its record (tensors on the device), with the host's wait for the batch.
        `log`: the step is logged, so it also computes the figures only a logged line shows (entropy, KL)."""
        self.heartbeat.begin_step(step)
        batch, data_wait = self.step.next_batch(batches)
        self.unread_keys[step] = batch.keys
        try:
            record = self.step(step, batch, log=log)
        except NonFiniteStep:  # an engine that reads the guard each step: stop with the guard's message
            self.check_finite()
            raise
        return {**record, "data_wait_s": data_wait}

    def report(self, step: int, plan: StepPlan, record: dict) -> None:
        """The plan's reads, before anything saves: the guard, the validation, the logged line."""
        if plan.check_finite:
            self.check_finite()  # before anything reads the weights or writes them
        if plan.validate:
            record.update(
                self.validation(self.method, self.engine.autocast, plan.done, plan.done / self.steps_per_epoch)
            )
        if plan.log:
            record = read_record(record, self.info.dp_group)  # the mean over the data-parallel ranks
            self._log(step, record)
            self.bar.set_postfix(loss=f"{record['loss']:.4f}")
        self.bar.update(1)

    def end(self, ended: str) -> None:
        """`ended`: finished, preempted or stopped (by an error), for `scale status`."""
        self.heartbeat.close(ended)
        self.bar.close()
        try:
            self.checkpointer.close()  # the checkpoint sealed first: a preempted job may be killed any moment
        finally:
            self.metrics.close()  # bounded (scale.trackers.CLOSE_TIMEOUT_S): never holds up the exit

    def save(self, step: int) -> None:
        """A checkpoint, once the disk has room for it: else every rank stops, before anything is written."""
        self.heartbeat.enter("checkpoint")
        self.checkpointer.wait()  # an async save still writing: the space it takes, or its failure, first
        first = weights_bytes(self.method.student, self.method.teacher)
        check_before_save(self.run.checkpoints, self.run.root, step, self.info.is_main, self.info.dp_group, first)
        self.checkpointer.save(step)

    def check_finite(self) -> None:
        """Collective, a host read of the non-finite guard: stops the run at the first bad step of any rank,
        naming it as metrics.jsonl numbers it (steps done) and its samples on the rank that saw it."""
        found = self.step.guard.read()
        keys, self.unread_keys = self.unread_keys, {}
        if found is None:
            return
        step, what = found
        mine = self.step.guard.is_first_rank(step)
        names = keys.get(step, []) if mine else None
        report = [(self.info.rank, names)]
        group = self.info.dp_group
        if group is not None and dist.get_world_size(group) > 1:
            gathered = [None] * dist.get_world_size(group)
            dist.all_gather_object(gathered, report[0], group=group)
            report = gathered
        rank, names = next(((r, n) for r, n in report if n is not None), (self.info.rank, []))
        shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
        raise NonFiniteLoss(
            f"{what} at step {step + 1} (rank {rank}; samples {shown or 'unknown'}). No update from it or a later "
            f"step was saved; the last checkpoint in {self.run.checkpoints} is clean. See "
            f"docs/how-to/troubleshooting.md, 'NaN loss' (fp16 with small patches, lr, teacher temperature)."
        )

    def _log(self, step: int, record: dict) -> None:
        record.update(global_metrics(self.loader.metrics(), self.info.dp_group))  # every rank: a collective
        record["epoch"] = epochs_done(step + 1, self.steps_per_epoch)  # as the checkpoint at this step records it
        if self.resumed_at is not None:
            record["resumed_at"], self.resumed_at = self.resumed_at, None
        self.metrics.log(step + 1, record)
        self.heartbeat.logged()
        self.collapse.check(step + 1, record)

"""The non-finite guard: a non-finite loss never reaches the weights, the teacher or the optimizer state (the flag
on the device makes the optimizer and the EMA skip, for that step and every later one); an absurd learning rate
(finite loss, overflowing update) is caught too; the run stops at the next read naming the step as metrics.jsonl
numbers it and its samples, and no checkpoint holds a bad step."""

import math

import pytest
import torch

from scale.checkpoint.export import read_tensors
from scale.checkpoint.store import CheckpointStore
from scale.config import load_recipe
from scale.data.synthetic import SyntheticLoader
from scale.engine.parallel import init_parallel
from scale.errors import NonFiniteLoss
from scale.loop.rundir import RunDir
from scale.loop.step import TrainStep
from scale.loop.train import Trainer

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

TINY = [
    "train.global_batch=4",
    "data.views.n_local=[2]",
    "method.dino.out_dim=64",
    "method.dino.hidden_dim=32",
    "method.dino.bottleneck_dim=16",
    "optim.warmup_epochs=0",
    "train.knn_monitor_every=0",
]


def nan_at(method, bad_steps: set[int]) -> None:
    """The method's loss becomes NaN (still connected to the graph) at the given steps."""
    loss_fn = method.loss

    def loss(batch, ctx):
        value, metrics = loss_fn(batch, ctx)
        return (value * math.nan if ctx.step in bad_steps else value), metrics

    method.loss = loss


def state(step: TrainStep) -> dict[str, torch.Tensor]:
    """Parameters and optimizer state (BatchNorm statistics move in every forward, bad or not, as before)."""
    out = {f"student.{k}": v.detach().clone() for k, v in step.method.student.named_parameters()}
    out.update({f"teacher.{k}": v.detach().clone() for k, v in step.method.teacher.named_parameters()})
    for i, s in enumerate(step.engine.optimizer.state.values()):
        out.update({f"optim.{i}.{k}": v.detach().clone() for k, v in s.items() if torch.is_tensor(v)})
    return out


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_a_nan_loss_never_reaches_weights_teacher_or_optimizer(group, engine):
    info, device = group
    # engine.unsharded_ddp=false: FSDP2 itself, which one rank would run as DDP (scale.engine.kinds.runs_as)
    cfg = load_recipe("demo/dino_tiny", [*TINY, f"engine.kind={engine}", "engine.unsharded_ddp=false"])
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size))
    nan_at(step.method, {1})
    batches = step.batches()
    step(0, step.next_batch(batches)[0])
    before = state(step)
    for i in (1, 2, 3):  # the bad step, then good ones: the flag is sticky until the loop reads it
        step(i, step.next_batch(batches)[0])
    after = state(step)
    assert before.keys() == after.keys()
    for name, value in before.items():
        assert torch.equal(value, after[name]), name
    assert step.guard.read() == (1, "non-finite loss")


def test_an_overflowing_update_is_flagged(group):
    info, device = group
    cfg = load_recipe("demo/dino_tiny", [*TINY, "engine.kind=ddp"])
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size))
    assert isinstance(step.loader, SyntheticLoader) and not step.prefetched  # CPU: no device prefetch
    batches = step.batches()
    step(0, step.next_batch(batches)[0])
    assert step.guard.read() is None
    step.lr = lambda i: 1e30  # an absurd learning rate: the loss stays finite, the weights go beyond 1e19
    teacher = {k: v.detach().clone() for k, v in step.method.teacher.named_parameters()}
    step(1, step.next_batch(batches)[0])
    assert step.guard.read() == (1, "overflowing update (parameters beyond fp32 range)")
    for name, value in step.method.teacher.named_parameters():  # the EMA skipped the bad step
        assert torch.equal(value, teacher[name]), name


def run_trainer(tmp_path, monkeypatch, data, sabotage) -> tuple[str, RunDir]:
    """A 1-process run saving every 2 steps, logging rarely; `sabotage(trainer)` makes step index 3 bad."""
    monkeypatch.setenv("SCALE_DATA", str(data))
    overrides = [*TINY, "train.max_steps=8", "train.ckpt_every_steps=2", "train.log_every=100"]
    fsdp2 = ["engine.kind=fsdp2", "engine.unsharded_ddp=false"]  # FSDP2 itself, not the DDP one rank would run
    cfg = load_recipe("demo/dino_tiny", [*overrides, *fsdp2, "train.preempt_check_every=100"])
    info, device = init_parallel()
    run = RunDir(tmp_path / "run")
    trainer = Trainer(cfg, run, info, device)
    sabotage(trainer)
    with pytest.raises(NonFiniteLoss) as err:
        trainer.fit()
    return str(err.value), run


def assert_clean_checkpoints(run: RunDir) -> None:
    steps = [int(p.name.removeprefix("step_")) for p in CheckpointStore(run.checkpoints).candidates()]
    assert steps == [2], steps  # the bad step is index 3 (metrics step 4): its checkpoint is never written
    tensors = read_tensors(CheckpointStore(run.checkpoints).candidates()[0], "")
    worst = max(t.abs().max().item() for t in tensors.values() if t.is_floating_point() and t.numel())
    assert worst < 1e3


def test_run_stops_at_a_nan_loss_naming_step_and_samples(group, tmp_path, monkeypatch, embedded_data):
    message, run = run_trainer(tmp_path, monkeypatch, embedded_data, lambda t: nan_at(t.method, {3}))
    assert "non-finite loss at step 4 (rank 0; samples " in message and "samples unknown" not in message
    assert_clean_checkpoints(run)


def test_run_stops_at_an_absurd_learning_rate(group, tmp_path, monkeypatch, embedded_data):
    def absurd_from_step_3(trainer):
        schedule = trainer.step.lr
        trainer.step.lr = lambda i: 1e30 if i >= 3 else schedule(i)

    message, run = run_trainer(tmp_path, monkeypatch, embedded_data, absurd_from_step_3)
    assert "overflowing update (parameters beyond fp32 range) at step 4" in message
    assert_clean_checkpoints(run)

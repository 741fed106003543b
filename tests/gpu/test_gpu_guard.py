"""The non-finite guard on CUDA (scale/engine/guard.py): a step whose loss is NaN, or whose loss is finite but whose
gradients are infinite, makes no update: the student's and the teacher's parameters and the optimizer state (fused
AdamW's moments and step counts: its `found_inf` skips the whole update in the kernel) are bit-identical before the
bad step and after it and two more (the flag is sticky until the loop reads it), and the guard names the bad step
and its kind. The bad step itself makes no host sync: no `.item()`-like read (the CPU tests' SyncCounter) and, on
CUDA, no synchronizing CUDA call (`torch.cuda.set_sync_debug_mode("error")` raises at one). The demo DINO recipe
(tiny ViT) in one process, DDP and FSDP2, as tests/loop/test_step_guard.py does on the CPU."""

import math

import pytest
import torch
from gpu_env import DEVICE

from scale.bench.host import SyncCounter
from scale.config import load_recipe
from scale.data.synthetic import SyntheticLoader
from scale.loop.step import TrainStep
from tests.loop.test_step_guard import TINY, nan_at, state

pytestmark = pytest.mark.gpu

BAD = 2  # the bad step (0-based), after two good ones


class InfiniteGradient(torch.autograd.Function):
    """The identity forward; its backward makes every gradient infinite (NaN after the clip)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * math.inf


def inf_grad_at(method, bad_steps: set[int]) -> None:
    loss_fn = method.loss

    def loss(batch, ctx):
        value, metrics = loss_fn(batch, ctx)
        return (InfiniteGradient.apply(value) if ctx.step in bad_steps else value), metrics

    method.loss = loss


def no_cuda_sync():
    """Fail at any synchronizing CUDA call (a no-op on the CPU)."""
    if DEVICE != "cuda":
        return _Null()
    return _SyncDebug()


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _SyncDebug:
    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode("default")
        return False


INJECT = {"loss": (nan_at, "non-finite loss"), "gradient": (inf_grad_at, "non-finite gradient norm")}


@pytest.mark.parametrize("bad", INJECT)
@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_a_bad_step_skips_the_update_on_the_device_without_a_host_sync(group, engine, bad):
    info, device = group
    overrides = [*TINY, f"engine.kind={engine}", "train.grad_monitor_every=0", "data.prefetch_to_device=false"]
    overrides.append("engine.unsharded_ddp=false")  # fsdp2: FSDP2 itself, not the DDP one device runs (kinds.runs_as)
    cfg = load_recipe("demo/dino_tiny", overrides)
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size))
    inject, kind = INJECT[bad]
    inject(step.method, {BAD})
    batches = step.batches()
    for i in range(BAD):  # DDP rebuilds its buckets, once, in the second forward: a host sync of its own
        step(i, step.next_batch(batches)[0])
    assert step.guard.read() is None
    before = state(step)
    assert all(t.device.type == DEVICE for t in before.values())
    batch = step.next_batch(batches)[0]
    with SyncCounter() as counter, no_cuda_sync():
        step(BAD, batch)
    assert not counter.places, f"{len(counter.places)} host syncs in the bad step, first at:\n{counter.places[0]}"
    for i in (BAD + 1, BAD + 2):
        step(i, step.next_batch(batches)[0])
    after = state(step)
    assert before.keys() == after.keys()
    changed = [name for name, value in before.items() if not torch.equal(value, after[name])]
    assert not changed, f"updated after the bad step: {changed[:5]}"
    assert step.guard.read() == (BAD, kind)

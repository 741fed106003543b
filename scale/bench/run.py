"""Benchmark real training steps of a recipe: the training loop's own step (`scale.loop.step.TrainStep`, built as
training builds it: method, engine, schedules, guard), on the recipe's shards or on synthetic batches.

Measured, per rank, then combined over ranks (the slowest rank's time, the largest memory):
- step time: wall clock of `steps` steps after `warmup` steps and one profiled step, each started after a barrier;
  images/s and crops/s per device and global; and the process's CPU seconds per step;
- phases: data wait (next batch + copy to the device), forward (the method's loss: student and teacher forwards
  and the loss), backward (including the gradient all-reduce / reduce-scatter the engine overlaps with it),
  optimizer (clipping, non-finite checks, step, EMA of the teacher), other (metrics); on GPU each phase ends with a
  device synchronisation;
- communication: time inside collectives during the profiled step (scale.bench.memory), which overlaps phases;
- peak memory: see scale.bench.memory (CUDA max allocated; CPU tracked tensor bytes and peak RSS);
- per-rank bytes of parameters, gradients, optimizer state and teacher (`Engine.memory()`);
- MFU: model FLOPs of the step (scale.bench.mfu) / step time / peak FLOP/s of the devices;
- compile time (engine.compile): the seconds torch.compile spent tracing and generating code in this setting, by
  dynamo's own clock (forward graphs in the warm-up step, backward graphs at its first backward); apart from the
  step time, which is measured after it. Each setting starts with empty dynamo caches, but inductor's on-disk cache
  of generated code, warm from an earlier run, shortens it.
"""

import contextlib
import gc
import statistics
import time
from collections import defaultdict

import torch
import torch.distributed as dist
from torch._dynamo.utils import calculate_time_spent

from scale.bench.memory import MemoryTrace
from scale.bench.mfu import device_peak, step_flops
from scale.bench.trace import trace_step
from scale.data.synthetic import SyntheticLoader, crop_layout
from scale.engine.base import no_phase
from scale.engine.compile import replays_cuda_graphs
from scale.engine.dist import DistInfo
from scale.engine.parallel import ParallelContext, parallel_context
from scale.loop.step import TrainStep, read_record
from scale.loop.train import train_loader

# schedules (lr, weight decay, teacher momentum) are arrays over every step of the run: with a benchmark's small
# batches an ImageNet run has 10^8 steps and its arrays would take gigabytes. Their values do not change what a
# step costs, so a benchmark builds them for a run of at most this many steps per epoch.
SCHEDULE_STEPS_PER_EPOCH = 1000
OPTIMIZER_PHASES = ("clip", "guard", "optimizer", "ema")  # the step's phases (TrainStep) reported as "optimizer"


class PhaseTimer:
    """Wall-clock seconds per phase name, summed over steps (the Trainer's `phase` hook)."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.totals: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.totals[name] += time.perf_counter() - start


def make_loader(cfg, info: ParallelContext, device: torch.device, synthetic: bool):
    if synthetic:
        return SyntheticLoader(cfg, info.dp_rank, info.dp_size, device)  # made once on the device
    return train_loader(cfg, info, device)


def bench_trainer(cfg, info: ParallelContext, device: torch.device, synthetic: bool, phase=no_phase) -> TrainStep:
    """The training loop's step as a benchmark runs it (also tools/device-check's profiled step)."""
    return TrainStep(
        cfg,
        info,
        device,
        lambda: make_loader(cfg, info, device, synthetic),
        max_schedule_steps_per_epoch=SCHEDULE_STEPS_PER_EPOCH,
        phase=phase,
    )


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def compile_seconds() -> float:
    """Seconds torch.compile has spent in this process (dynamo's accounting of frame and backward compiles)."""
    return calculate_time_spent().get("total_wall_time", 0.0)


def measure_rank(cfg, info: ParallelContext, device: torch.device, steps: int, warmup: int, synthetic: bool) -> dict:
    """This rank's numbers for one setting."""
    torch._dynamo.reset()  # this setting compiles its own graphs (engine.compile)
    compile_start = compile_seconds()
    timer = PhaseTimer(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with MemoryTrace(device, cuda_graphs=replays_cuda_graphs(cfg.engine)) as memory:
        trainer = bench_trainer(cfg, info, device, synthetic, phase=timer)
        batches = trainer.batches()
        for step in range(warmup):
            trainer(step, trainer.next_batch(batches)[0])
        barrier()
        with memory.window():
            record = trainer(warmup, trainer.next_batch(batches)[0])
    timer.totals.clear()
    times, cpu_times, waits = [], [], []
    for step in range(warmup + 1, warmup + 1 + steps):
        barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        batch, wait = trainer.next_batch(batches)
        record = trainer(step, batch, log=False)  # the loop's usual step: its record is not read on the host
        sync()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        waits.append(wait)
    phases = {name: timer.totals[name] / steps for name in ("forward", "backward")}
    phases["optimizer"] = sum(timer.totals[name] for name in OPTIMIZER_PHASES) / steps
    phases["data"] = sum(waits) / steps
    phases["other"] = max(0.0, statistics.mean(times) - sum(phases.values()))
    result = {
        "step_s": statistics.mean(times),
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "compile_s": compile_seconds() - compile_start,
        # CPU seconds of this process (all its threads): on a shared CPU machine, what the step costs whatever the
        # other processes take; about the wall time times the threads on an idle machine (on GPU: the host's share)
        "step_cpu_s_median": statistics.median(cpu_times),
        "phases": phases,
        "state": trainer.engine.memory(),
        "engine": trainer.engine.kind,  # the kind that ran (fsdp2 on one rank runs as ddp: kinds.runs_as)
        "loss": read_record(record)["loss"],
        **memory.result(),
    }
    del trainer, batches
    gc.collect()
    return result


def combine(ranks: list[dict]) -> dict:
    """The slowest rank's time and phases, the largest memory of any rank."""
    slowest = max(ranks, key=lambda r: r["step_s"])
    out = dict(slowest)
    for key in ("peak_bytes", "start_bytes", "rss_peak_bytes", "comm_s"):
        values = [r[key] for r in ranks if r.get(key) is not None]
        out[key] = max(values) if values else None
    out["state"] = {k: max(r["state"][k] for r in ranks) for k in slowest["state"]}
    return out


_PEAKS: dict[tuple, tuple[float, str]] = {}


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """Measured once per process and precision (rank 0's value is used)."""
    key = (device.type, precision)
    if key not in _PEAKS:
        _PEAKS[key] = device_peak(device, precision)
    return _PEAKS[key]


def bench_config(
    cfg,
    info: DistInfo,
    device: torch.device,
    steps: int = 5,
    warmup: int = 1,
    synthetic: bool = False,
    count_flops: bool = True,
) -> dict:
    """Collective: one setting's numbers (meaningful on rank 0)."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    info = parallel_context(info, device, cfg.engine.shard_size)  # once per setting: its shard_size may differ
    mine = measure_rank(cfg, info, device, steps, warmup, synthetic)
    ranks = [None] * info.world_size
    if dist.is_initialized():
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]
    result = combine(ranks)
    world, batch = info.world_size, cfg.train.global_batch
    crops = sum(n for n, _ in crop_layout(cfg.data.views))
    result.update(
        world=world,
        global_batch=batch,
        per_rank_batch=batch // world,
        crops_per_image=crops,
        images_per_s=batch / result["step_s"],
        crops_per_s=batch * crops / result["step_s"],
    )
    result["images_per_s_per_device"] = result["images_per_s"] / world
    result["crops_per_s_per_device"] = result["crops_per_s"] / world
    if count_flops:
        # on every rank: the loss it runs may call collectives (DINO's center)
        trace = trace_step(cfg, info=info)
        peak, source = peak_flops(device, cfg.engine.precision)
        flops = step_flops(trace, batch)
        result.update(
            flops_per_step=flops,
            peak_flops_per_device=peak,
            peak_source=source,
            mfu=flops / result["step_s"] / (peak * world),
        )
    return result

"""Per-rank memory of each engine: bytes of parameters, gradients and optimizer state (and the EMA teacher) that
one rank holds after a training step of a recipe's method, from `Engine.memory()`.

`measure(cfg, engines)` runs inside a process group (the bench command calls it); `python -m
scale.engine.memory_report RECIPE [overrides] --nproc 2 [--engines ddp,fsdp2,zero3]` spawns the group on CPU
(gloo) and prints the table. Parameters are counted exactly; activations are not (the synthetic step is tiny).
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from scale.data.batch import Batch

ENGINES = {
    "ddp": {"kind": "ddp"},
    "fsdp2": {"kind": "fsdp2"},
    "zero1": {"kind": "deepspeed", "zero_stage": 1},
    "zero2": {"kind": "deepspeed", "zero_stage": 2},
    "zero3": {"kind": "deepspeed", "zero_stage": 3},
}
KEYS = ("params", "grads", "optimizer", "teacher", "total")


def synthetic_batch(cfg, images: int, size: int) -> Batch:
    """Random crops in the recipe's view layout (global views, then each group of local views), at `size` px."""
    views = cfg.data.views
    groups = [views.n_global] + (list(views.n_local) if views.kind == "multicrop" else [])
    sizes = [size] + [max(size // 2, 16)] * (len(groups) - 1)
    crops = [torch.randn(n * images, 3, s, s) for n, s in zip(groups, sizes)]
    return Batch(crops, groups, torch.zeros(images, dtype=torch.long))


def measure_one(cfg, device: torch.device, image_size: int) -> dict[str, int]:
    from scale.engine import build_engine
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context
    from scale.methods import build_method
    from scale.methods.base import StepContext

    torch.manual_seed(cfg.train.seed)
    parallel = parallel_context(detect(), device, cfg.engine.shard_size)
    method = build_method(cfg, 1, 1, dp_group=parallel.dp_group)
    engine = build_engine(cfg.engine, cfg.optim, parallel, device)
    engine.setup(method)
    ctx = StepContext(step=0, epoch=0, steps_per_epoch=1, total_steps=1)
    for _ in range(cfg.engine.grad_accum):
        with engine.autocast():
            loss, _ = method.loss(synthetic_batch(cfg, 1, image_size).to(device), ctx)
        engine.backward(loss)
    engine.step(method.frozen_params(ctx))  # optimizer state exists after the first step on every engine
    if method.teacher is not None:
        engine.ema(method.ema_momentum(ctx))
    held = engine.memory()
    del method, engine
    gc.collect()
    return held


def measure(cfg, engines: list[str], image_size: int = 64) -> dict[str, dict[str, int]]:
    """Collective: for each engine label (see ENGINES), the largest per-rank bytes of each memory() entry."""
    from scale.engine.dist import detect, device_for

    device = device_for(detect())
    report = {}
    for label in engines:
        if label not in ENGINES:
            raise ValueError(f"unknown engine '{label}' (expected one of {', '.join(ENGINES)})")
        run_cfg = OmegaConf.merge(cfg, {"engine": ENGINES[label]})
        held = measure_one(run_cfg, device, image_size)
        values = torch.tensor([held[k] for k in KEYS], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        report[label] = {k: int(v) for k, v in zip(KEYS, values.tolist())}
    return report


def format_report(report: dict[str, dict[str, int]], world_size: int) -> str:
    base = report.get("ddp", {}).get("total")
    lines = [
        f"per-rank bytes at {world_size} ranks (MiB)",
        f"{'engine':8s}" + "".join(f"{k:>12s}" for k in KEYS) + ("  x ddp" if base else ""),
    ]
    for label, held in report.items():
        row = f"{label:8s}" + "".join(f"{held[k] / 2**20:12.1f}" for k in KEYS)
        lines.append(row + (f"  {held['total'] / base:.3f}" if base else ""))
    return "\n".join(lines)


def _worker(rank: int, world: int, port: int, recipe: str, overrides: list[str], engines: list[str]) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from scale.config import load_recipe
    from scale.engine.dist import init_distributed, shutdown

    init_distributed()
    try:
        report = measure(load_recipe(recipe, overrides), engines)
        if rank == 0:
            print(format_report(report, world), flush=True)
    finally:
        shutdown()


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    from scale.engine.dist import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args(argv)
    mp.spawn(
        _worker,
        args=(args.nproc, free_port(), args.recipe, args.overrides, args.engines.split(",")),
        nprocs=args.nproc,
        join=True,
    )


if __name__ == "__main__":
    main()

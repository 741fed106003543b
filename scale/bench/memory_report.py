"""Per-rank memory of each engine: bytes of parameters, gradients and optimizer state (and the EMA teacher) that
one rank holds after a training step of a recipe's method, from `Engine.memory()`.

`measure(cfg, engines)` runs inside a process group (the bench command calls it); `python -m
scale.bench.memory_report RECIPE [overrides] --nproc 2 [--engines ddp,fsdp2,zero3]` spawns the group on CPU
(gloo) and prints the table. Parameters are counted exactly; activations are not (one image per rank).
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from scale.engine.base import MEMORY_KEYS as KEYS
from scale.engine.kinds import SETTINGS, describe
from scale.engine.parallel import ParallelContext, parallel_context


def measure_one(cfg, info: ParallelContext, device: torch.device) -> tuple[dict[str, int], str]:
    """One training step (scale.loop.step.TrainStep, as training runs it) on one synthetic image per micro-batch and
    rank, in the recipe's crop layout; then what the engine holds, and the engine kind that ran (fsdp2 on one rank
    runs as ddp: scale.engine.kinds.runs_as)."""
    from scale.data.synthetic import SyntheticLoader
    from scale.loop.step import TrainStep

    cfg = OmegaConf.merge(cfg, {"train": {"global_batch": info.world_size * cfg.engine.grad_accum}})
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size), "", 1)
    step(0, step.next_batch(step.batches())[0])  # optimizer state exists after the first step on every engine
    held = step.engine.memory()
    ran = step.engine.kind
    del step
    gc.collect()
    return held, ran


def measure(cfg, engines: list[str]) -> dict[str, dict[str, int]]:
    """Collective: for each engine setting (scale.engine.kinds.SETTINGS), the largest per-rank bytes of each
    memory() entry, and under "engine" what ran ('ddp (fsdp2 on one rank)')."""
    from scale.engine.dist import detect, device_for

    info = detect()
    device = device_for(info)
    report = {}
    for label in engines:
        if label not in SETTINGS:
            raise ValueError(f"unknown engine '{label}' (expected one of {', '.join(SETTINGS)})")
        run_cfg = OmegaConf.merge(cfg, {"engine": SETTINGS[label]})
        held, ran = measure_one(run_cfg, parallel_context(info, device, run_cfg.engine.shard_size), device)
        values = torch.tensor([held[k] for k in KEYS], dtype=torch.float64)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        report[label] = {k: int(v) for k, v in zip(KEYS, values.tolist())}
        report[label]["engine"] = describe(run_cfg.engine.kind, ran, info.world_size)
    return report


def format_report(report: dict[str, dict[str, int]], world_size: int) -> str:
    base = report.get("ddp", {}).get("total")
    lines = [
        f"per-rank bytes at {world_size} ranks (MiB)",
        f"{'engine':8s}" + "".join(f"{k:>12s}" for k in KEYS) + ("  x ddp" if base else ""),
    ]
    for label, held in report.items():
        row = f"{label:8s}" + "".join(f"{held[k] / 2**20:12.1f}" for k in KEYS)
        kind = SETTINGS.get(label, {}).get("kind", label)
        ran = f"  runs as {held['engine']}" if held.get("engine", kind) != kind else ""
        lines.append(row + (f"  {held['total'] / base:.3f}" if base else "") + ran)
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
    parser.add_argument("--engines", default=",".join(SETTINGS))
    args = parser.parse_args(argv)
    mp.spawn(
        _worker,
        args=(args.nproc, free_port(), args.recipe, args.overrides, args.engines.split(",")),
        nprocs=args.nproc,
        join=True,
    )


if __name__ == "__main__":
    main()

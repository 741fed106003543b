"""The real methods (scale.methods) with a tiny ViT under each engine, for the parity tests: DINO (multi-crop,
center all-reduced across ranks, frozen last layer), MoCo v3 (keys gathered across ranks), and for the GPU tests
EsViT (region loss) and DRLoc (no teacher; fixed pairs). The ranks train on the device init_distributed picks."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from engine_toy import all_ranks, shard_batch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from scale.config.schema import Recipe
from scale.data.batch import Batch
from scale.methods.base import StepContext
from scale.methods.config import MOCO_KINDS

STEPS, STEPS_PER_EPOCH, GLOBAL_BATCH = 4, 2, 8
LR, WD = 1e-3, 0.04


def recipe(kind: str, engine_kw: dict, freeze_epochs: int, model_kw: dict | None = None):
    """model_kw: other model settings than the tiny ViT's (the GPU tests' Swin)."""
    cfg = OmegaConf.structured(Recipe)
    cfg.method.kind = kind
    cfg.model.name, cfg.model.img_size, cfg.model.drop_path = "vit_nano", 32, 0.0
    cfg.model.update(model_kw or {})
    cfg.method.dino.update(out_dim=64, hidden_dim=32, bottleneck_dim=16, freeze_last_layer=freeze_epochs)
    for moco in MOCO_KINDS:
        cfg.method[moco].update(dim=16, mlp_dim=32)
        if "bn_in_heads" in cfg.method[moco]:
            cfg.method[moco].bn_in_heads = False  # no SyncBN on CPU: no BatchNorm in the heads
    cfg.method.drloc.update(pairs=8, grid=2, hidden_dim=32)
    cfg.method.supervised.update(mixup=0.0, cutmix=0.0)  # no random mixing: every device draws differently
    cfg.data.num_classes = 4
    # eps 1e-6, not 1e-8: Adam moves a weight by lr * g / (|g| + eps), so with 1e-8 a gradient element that is 0 up
    # to rounding (1e-8 on one device, 3e-8 on another: Swin's fc2 in the device check's fp32 experiment, issue 46)
    # moves by a tenth of lr, past the devices' 1e-4 tolerance; 1e-6 bounds that amplification to lr / 1e-6
    cfg.optim.update(lr=LR, weight_decay=WD, eps=1e-6, clip_grad=0.3, clip_mode="per_param")
    cfg.engine.update(engine_kw)
    return cfg


def make_batch(step: int, kind: str) -> Batch:
    gen = torch.Generator().manual_seed(step)
    base = F.interpolate(torch.randn(GLOBAL_BATCH, 3, 4, 4, generator=gen), size=48, mode="bilinear")

    def views(count, size):
        return torch.cat(
            [
                F.interpolate(base + 0.1 * torch.randn(base.shape, generator=gen), size=size, mode="bilinear")
                for _ in range(count)
            ]
        )

    crops, counts = ([views(1, 32)], [1]) if kind == "drloc" else ([views(2, 32)], [2])  # DRLoc: one view
    if kind in ("dino", "esvit"):
        crops.append(views(2, 16))
        counts.append(2)
    return Batch(crops, counts, torch.zeros(GLOBAL_BATCH, dtype=torch.long))


def fixed_positions(batch: int, k: int, m: int, exhaustive: bool, device=None) -> tuple:
    """DRLoc's pairs without randomness (CPU and CUDA generators draw differently, and each rank draws for its own
    images): the same m pairs of cells for every image."""
    cell = torch.arange(m, device=device)
    pos1 = torch.stack([cell % k, (cell // k) % k], dim=-1)
    pos2 = torch.stack([(cell + 1) % k, (cell // k + 1) % k], dim=-1)
    return pos1.expand(batch, m, 2), pos2.expand(batch, m, 2)


def real_run(
    kind: str, engine_kw: dict, freeze_epochs: int = 1, steps: int = STEPS, model_kw: dict | None = None
) -> dict:
    """Each rank trains on its share of the same global batches; losses are averaged over ranks."""
    from scale.engine import build_engine
    from scale.engine.dist import detect, device_for
    from scale.engine.parallel import parallel_context
    from scale.methods import build_method, drloc
    from scale.optim import apply_schedule

    drloc.sample_positions = fixed_positions  # in the spawned rank only
    torch._dynamo.reset()  # engine.compile: each run compiles its own graphs, counted from here
    graphs_before = counters["stats"]["unique_graphs"]
    cfg = recipe(kind, engine_kw, freeze_epochs, model_kw)
    device = device_for(detect())
    info = parallel_context(detect(), device, cfg.engine.shard_size)
    torch.manual_seed(0)
    method = build_method(cfg, STEPS_PER_EPOCH, steps, dp_group=info.dp_group)
    engine = build_engine(cfg.engine, cfg.optim, info, device)
    engine.setup(method)
    losses, grad_norms = [], []
    for step in range(steps):
        ctx = StepContext(step=step, epoch=step // STEPS_PER_EPOCH, steps_per_epoch=STEPS_PER_EPOCH, total_steps=steps)
        with engine.autocast():
            batch = shard_batch(make_batch(step, kind), info.dp_rank, info.dp_size).to(engine.device)
            loss, _ = method.loss(batch, ctx)
        engine.backward(loss)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean, group=info.dp_group)
        losses.append(float(mean) / info.dp_size)
        apply_schedule(engine.optimizer.param_groups, LR, WD)
        grad_norms.append(float(engine.step(method.frozen_params(ctx))["grad_norm"]))
        if method.teacher is not None:
            engine.ema(method.ema_momentum(ctx))
    return {
        "losses": losses,
        "grad_norms": grad_norms,
        "memory": all_ranks(engine.memory()),  # every rank's bytes, in rank order
        "student": engine.export_state_dict("student"),
        "teacher": engine.export_state_dict("teacher") if method.teacher is not None else {},
        "compiled_graphs": counters["stats"]["unique_graphs"] - graphs_before,
    }


def real_jobs(jobs: list[tuple], steps: int = STEPS) -> dict:
    """(label, kind, engine_kw, freeze_epochs[, model_kw]) runs in one process group."""
    return {
        label: real_run(kind, engine_kw, freeze, steps, *model_kw) for label, kind, engine_kw, freeze, *model_kw in jobs
    }

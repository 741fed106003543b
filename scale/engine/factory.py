"""`build_engine`: the recipe's engine.kind picks the implementation; everything else is shared configuration."""

import torch

from scale.engine.base import Engine
from scale.engine.dist import DistInfo
from scale.engine.parallel import as_parallel
from scale.errors import UserError

KINDS = ("ddp", "fsdp2", "deepspeed")


def build_engine(engine_cfg, optim_cfg, dist_info: DistInfo, device: torch.device) -> Engine:
    """`dist_info`: the run's ParallelContext (or a plain DistInfo, from which one is built for engine.shard_size)."""
    dist_info = as_parallel(dist_info, device, engine_cfg.shard_size)
    if engine_cfg.kind == "ddp":
        from scale.engine.ddp import DDPEngine

        return DDPEngine(engine_cfg, optim_cfg, dist_info, device)
    if engine_cfg.kind == "fsdp2":
        from scale.engine.fsdp import FSDPEngine

        return FSDPEngine(engine_cfg, optim_cfg, dist_info, device)
    if engine_cfg.kind == "deepspeed":
        from scale.engine.deepspeed import DeepSpeedEngine

        return DeepSpeedEngine(engine_cfg, optim_cfg, dist_info, device)
    raise UserError(f"engine.kind='{engine_cfg.kind}' is not one of {', '.join(KINDS)}")

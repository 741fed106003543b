"""`build_engine`: the recipe's engine.kind picks the implementation (scale.engine.kinds), as the ranks run it
(`runs_as`: FSDP2 on a shard group of one rank runs as DDP); everything else is shared configuration."""

import importlib

import torch

from scale.engine.base import Engine
from scale.engine.kinds import KINDS, runs_as
from scale.engine.parallel import ParallelContext


def build_engine(engine_cfg, optim_cfg, dist_info: ParallelContext, device: torch.device) -> Engine:
    kind = runs_as(engine_cfg.kind, dist_info.world_size, dist_info.shard_size, engine_cfg.unsharded_ddp)
    module, name = KINDS[kind]
    return getattr(importlib.import_module(module), name)(engine_cfg, optim_cfg, dist_info, device)

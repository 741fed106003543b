"""`build_engine`: the recipe's engine.kind picks the implementation (scale.engine.kinds); everything else is
shared configuration."""

import importlib

import torch

from scale.engine.base import Engine
from scale.engine.dist import DistInfo
from scale.engine.kinds import KINDS
from scale.engine.parallel import as_parallel


def build_engine(engine_cfg, optim_cfg, dist_info: DistInfo, device: torch.device) -> Engine:
    """`dist_info`: the run's ParallelContext (or a plain DistInfo, from which one is built for engine.shard_size)."""
    dist_info = as_parallel(dist_info, device, engine_cfg.shard_size)
    module, name = KINDS[engine_cfg.kind]
    return getattr(importlib.import_module(module), name)(engine_cfg, optim_cfg, dist_info, device)

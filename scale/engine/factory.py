"""`build_engine`: the recipe's engine.kind picks the implementation (scale.engine.kinds); everything else is
shared configuration."""

import importlib

import torch

from scale.engine.base import Engine
from scale.engine.kinds import KINDS
from scale.engine.parallel import ParallelContext


def build_engine(engine_cfg, optim_cfg, dist_info: ParallelContext, device: torch.device) -> Engine:
    module, name = KINDS[engine_cfg.kind]
    return getattr(importlib.import_module(module), name)(engine_cfg, optim_cfg, dist_info, device)

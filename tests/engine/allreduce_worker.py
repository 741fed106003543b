"""Run by the bootstrap tests under torchrun or a faked Slurm environment: join, all-reduce, report."""

import json
import sys

import torch
import torch.distributed as dist

from scale.engine.dist import init_distributed, shutdown

info, device = init_distributed(timeout_minutes=2)
value = torch.tensor([float(info.rank + 1)])
dist.all_reduce(value)
record = {
    "rank": info.rank,
    "world": info.world_size,
    "local_rank": info.local_rank,
    "launcher": info.launcher,
    "sum": value.item(),
    "backend": dist.get_backend(),
}
sys.stdout.write(json.dumps(record) + "\n")  # one write: atomic on a pipe shared by both ranks
sys.stdout.flush()
shutdown()

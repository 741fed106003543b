"""The parallel context without processes: engine.shard_size validation, and the training loader split by the
data-parallel rank, so that a run resumed on another mesh shape continues at the right global sample."""

import pytest
import torch
from omegaconf import OmegaConf

from scale.engine.dist import DistInfo
from scale.engine.parallel import ParallelContext, parallel_context, resolve_shard_size
from scale.errors import UserError
from scale.loop.train import train_loader
from tests.data.helpers import good_shards, tiny_cfg

CPU = torch.device("cpu")


def info(rank: int = 0, world: int = 1) -> DistInfo:
    return DistInfo(rank, world, rank, "127.0.0.1", 29500, "single")


def test_shard_size_zero_is_every_rank_and_must_divide_the_world():
    assert resolve_shard_size(0, 8) == 8
    assert resolve_shard_size(4, 8) == 4
    with pytest.raises(UserError, match="engine.shard_size=3 must divide the number of ranks \\(8\\)"):
        resolve_shard_size(3, 8)
    with pytest.raises(UserError, match="engine.shard_size=-1"):
        resolve_shard_size(-1, 8)


def test_without_a_process_group_the_context_is_local():
    ctx = parallel_context(info(), CPU, 0)
    assert (ctx.mesh, ctx.dp_group, ctx.dp_rank, ctx.dp_size, ctx.shard_size) == (None, None, 0, 1, 1)
    assert ctx.is_main and ctx.launcher == "single"
    assert parallel_context(info(0, 4), CPU, 2).shard_size == 2


def contexts(dp_size: int, rank_offset: int = 0) -> list[ParallelContext]:
    """The data-parallel ranks of a mesh (global ranks shifted, as another parallel axis would)."""
    return [
        ParallelContext(**vars(info(r + rank_offset, dp_size + rank_offset)), dp_rank=r, dp_size=dp_size)
        for r in range(dp_size)
    ]


def global_keys(cfg, ranks: list[ParallelContext], steps: int, state: dict | None = None):
    loaders = [train_loader(cfg, ctx, CPU) for ctx in ranks]
    for loader in loaders:
        if state:
            loader.load_state_dict(state)
    per_rank = [[b.keys for _, b in zip(range(steps), loader)] for loader in loaders]
    return [sorted(k for keys in step for k in keys) for step in zip(*per_rank)], loaders[0].state_dict()


def test_loader_splits_by_data_parallel_rank_and_resumes_on_another_mesh(tmp_path):
    good_shards(tmp_path, [20, 28])  # 48 samples: 4 steps of 12
    cfg = OmegaConf.create({"data": tiny_cfg(tmp_path), "train": {"global_batch": 12, "seed": 3}})
    OmegaConf.update(cfg, "train.samples_per_epoch", None)
    full, _ = global_keys(cfg, contexts(1), 4)
    # 2x2 HSDP: 4 data-parallel ranks (global ranks 2..5 here: the split must follow dp_rank, not rank)
    head, state = global_keys(cfg, contexts(4, rank_offset=2), 2)
    assert head == full[:2] and state["position"] == 24
    for ranks in (contexts(1), contexts(2), contexts(4)):  # 1 rank, a 2-rank and a 4-rank mesh
        rest, _ = global_keys(cfg, ranks, 2, state)
        assert rest == full[2:]


def test_deepspeed_hierarchical_partitioning_is_zero3_only():
    pytest.importorskip("deepspeed")
    from scale.engine.config import EngineConfig, OptimConfig
    from scale.engine.deepspeed import DeepSpeedEngine, ds_config
    from scale.engine.precision import resolve_precision

    two_nodes = ParallelContext(**vars(info(0, 4)), shard_size=2)
    with pytest.raises(UserError, match="engine.shard_size=2 with engine.kind=deepspeed needs engine.zero_stage=3"):
        DeepSpeedEngine(EngineConfig(kind="deepspeed", zero_stage=2, shard_size=2), OptimConfig(), two_nodes, CPU)
    zero3 = DeepSpeedEngine(EngineConfig(kind="deepspeed", zero_stage=3, shard_size=2), OptimConfig(), two_nodes, CPU)
    assert zero3.hpz_size == 2
    config = ds_config(zero3.cfg, zero3.optim_cfg, resolve_precision("fp32", CPU), hpz_size=zero3.hpz_size)
    assert config["zero_optimization"]["zero_hpz_partition_size"] == 2
    one_group = ParallelContext(**vars(info(0, 4)), shard_size=4)  # shard_size = world: plain ZeRO
    assert DeepSpeedEngine(EngineConfig(kind="deepspeed", zero_stage=1), OptimConfig(), one_group, CPU).hpz_size == 1

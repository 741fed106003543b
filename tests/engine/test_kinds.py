"""The engine kinds' one rule (scale/engine/kinds.py runs_as): fsdp2 whose shard group is one rank runs as DDP,
where the engine is built, where `scale submit` and `scale plan` lay the recipe out, and in what they print."""

import pytest
import torch
from engine_toy import optim_config

from scale.engine.config import EngineConfig
from scale.engine.ddp import DDPEngine
from scale.engine.factory import build_engine
from scale.engine.fsdp import FSDPEngine
from scale.engine.kinds import describe, recipe_setting, runs_as
from scale.engine.parallel import ParallelContext

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "kind, world, shard_size, ran",
    [
        ("fsdp2", 1, 0, "ddp"),  # one rank: nothing to shard
        ("fsdp2", 1, 1, "ddp"),
        ("fsdp2", 2, 0, "fsdp2"),
        ("fsdp2", 2, 2, "fsdp2"),
        ("fsdp2", 4, 1, "ddp"),  # HSDP 4 x 1: plain replication
        ("fsdp2", 4, 2, "fsdp2"),  # HSDP 2 x 2
        ("ddp", 1, 0, "ddp"),
        ("deepspeed", 1, 0, "deepspeed"),  # ZeRO's own rules: not this one
    ],
)
def test_fsdp2_on_a_shard_group_of_one_rank_runs_as_ddp(kind, world, shard_size, ran):
    assert runs_as(kind, world, shard_size) == ran
    assert runs_as(kind, world, shard_size, unsharded_ddp=False) == kind


def test_the_start_up_line_says_what_runs_and_why():
    assert describe("fsdp2", "ddp", 1) == "ddp (fsdp2 on one rank)"
    assert describe("fsdp2", "ddp", 8) == "ddp (fsdp2 with engine.shard_size 1)"
    assert describe("fsdp2", "fsdp2", 8) == "fsdp2"


@pytest.mark.parametrize(
    "args, expected",
    [
        (("fsdp2", 1, 0, 1, 1), ("ddp", 0)),  # one GPU
        (("fsdp2", 1, 0, 4, 1), ("ddp", 1)),  # 4 nodes of one GPU: a shard group per node, of one rank
        (("fsdp2", 1, 0, 1, 8), ("fsdp2", 0)),
        (("fsdp2", 1, 0, 1, 1, False), ("fsdp2", 0)),  # engine.unsharded_ddp=false
        (("fsdp2", 1, 0, 4, 1, False), ("hsdp", 1)),
    ],
)
def test_submit_and_plan_lay_out_the_rule(args, expected):
    assert recipe_setting(*args) == expected


@pytest.mark.parametrize(
    "world, shard_size, unsharded_ddp, engine",
    [
        (1, 1, True, DDPEngine),
        (1, 1, False, FSDPEngine),
        (2, 2, True, FSDPEngine),
        (4, 1, True, DDPEngine),  # HSDP of shard groups of one rank
        (4, 2, True, FSDPEngine),
    ],
)
def test_build_engine_applies_the_rule(world, shard_size, unsharded_ddp, engine):
    """The resolved parallel context (no process group needed to build, only to set up)."""
    info = ParallelContext(0, world, 0, "127.0.0.1", 0, "single", shard_size=shard_size)
    cfg = EngineConfig(kind="fsdp2", unsharded_ddp=unsharded_ddp)
    assert type(build_engine(cfg, optim_config(), info, CPU)) is engine

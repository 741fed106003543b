"""The setting a recipe runs with on a given set of nodes: the one function (`launch_setting`) that `scale submit`
renders and `scale plan` judges, so that both describe the same run. Import-light (no torch): submit calls it on a
login node before anything heavy is loaded."""

from dataclasses import dataclass

from scale.engine.kinds import recipe_setting, setting_overrides


@dataclass(frozen=True)
class Setting:
    """An engine setting the planner predicts: engine (a key of scale.engine.kinds.SETTINGS, or "hsdp"),
    activation checkpointing, micro-batch and accumulation, shard size; compile, for the label and for the weights the
    DDP engine keeps in the autocast dtype when not compiled (scale.bench.plan.lowp_bytes)."""

    engine: str
    ac: str = "none"  # none | every_n | full | selective (selective is costed as none: an upper bound)
    every_n: int = 2
    micro_batch: int = 1  # images per rank per forward
    grad_accum: int = 1
    shard_size: int = 0  # hsdp / zero3 hpZ: ranks per shard group (a node's GPUs)
    compile: bool = False

    @property
    def name(self) -> str:
        return f"hsdp/{self.shard_size}" if self.engine == "hsdp" else self.engine

    def label(self) -> str:
        ac = f"every_{self.every_n}" if self.ac == "every_n" else self.ac
        compiled = " compile" if self.compile else ""
        return f"{self.name} ac={ac} micro={self.micro_batch} accum={self.grad_accum}{compiled}"

    def overrides(self) -> list[str]:
        if self.engine == "hsdp":
            engine = ["engine.kind=fsdp2", f"engine.shard_size={self.shard_size}"]
        else:
            engine = setting_overrides(self.engine)
        ac = [f"engine.activation_checkpointing={self.ac}"] + (
            [f"engine.ac_every_n={self.every_n}"] if self.ac == "every_n" else []
        )
        return engine + ac + [f"engine.grad_accum={self.grad_accum}"]


def overrides_key(overrides: list[str], key: str) -> bool:
    """Whether `key` is set on the command line (`key=...`, `+key=...`, `~key`)."""
    return any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides)


def launch_setting(cfg, overrides: list[str], nodes: int, ranks_per_node: int) -> Setting:
    """The setting `cfg` (loaded with `overrides`) runs with on `nodes` x `ranks_per_node` ranks: its engine laid
    out by scale.engine.kinds.recipe_setting (several nodes: a sharding engine shards within a node; fsdp2 on one
    rank per shard group: DDP), unless the
    command line sets engine.shard_size itself; its checkpointing, accumulation and compile as written."""
    engine = cfg.engine
    world = nodes * ranks_per_node
    shard_size = int(engine.shard_size)
    unsharded_ddp = bool(engine.unsharded_ddp)
    if overrides_key(overrides, "engine.shard_size"):  # the user's own shard size, even 0 (all ranks)
        name, _ = recipe_setting(engine.kind, engine.zero_stage, shard_size, 1, world, unsharded_ddp)
    else:
        name, shard_size = recipe_setting(
            engine.kind, engine.zero_stage, shard_size, nodes, ranks_per_node, unsharded_ddp
        )
    accum = int(engine.grad_accum)
    per_rank = int(cfg.train.global_batch) // max(world, 1)
    return Setting(
        name,
        ac=str(engine.activation_checkpointing),
        every_n=int(engine.ac_every_n),
        micro_batch=max(per_rank // accum, 1),
        grad_accum=accum,
        shard_size=shard_size,
        compile=bool(engine.compile),
    )

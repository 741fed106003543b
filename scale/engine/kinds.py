"""The engine kinds, in one table: `engine.kind` -> the module and class that implement it, and the engine settings
that `scale bench --matrix engine=...`, the planner and the memory report compare (a kind with its options).
Import-light: no torch.distributed, no DeepSpeed."""

KINDS = {
    "ddp": ("scale.engine.ddp", "DDPEngine"),
    "fsdp2": ("scale.engine.fsdp", "FSDPEngine"),
    "deepspeed": ("scale.engine.deepspeed", "DeepSpeedEngine"),
}

ZERO_STAGES = (1, 2, 3)  # engine.zero_stage, deepspeed only

SETTINGS = {
    "ddp": {"kind": "ddp"},
    "fsdp2": {"kind": "fsdp2"},
    "zero1": {"kind": "deepspeed", "zero_stage": 1},
    "zero2": {"kind": "deepspeed", "zero_stage": 2},
    "zero3": {"kind": "deepspeed", "zero_stage": 3},
}

# settings whose engine runs the nets' forwards on copies of their Linear and Conv weights kept in the autocast dtype
# (scale/engine/lowp.py): not FSDP2 (its mixed-precision policy casts the gathered weights once per forward) nor
# DeepSpeed
LOW_PRECISION_WEIGHTS = ("ddp",)


def holds_low_precision_weights(setting: str, precision: str, compiled: bool) -> bool:
    """Whether the engine of `setting` keeps those copies: in mixed precision, and not where engine.compile fuses
    the casts into the compiled blocks."""
    return setting in LOW_PRECISION_WEIGHTS and precision != "fp32" and not compiled


def setting_overrides(label: str) -> list[str]:
    """Recipe overrides of an engine setting ('zero3' -> engine.kind=deepspeed engine.zero_stage=3)."""
    return [f"engine.{key}={value}" for key, value in SETTINGS[label].items()]


def shards_parameters(kind: str, zero_stage: int) -> bool:
    """Whether the engine shards the parameters themselves (FSDP2, ZeRO-3), gathering them per layer."""
    return kind == "fsdp2" or (kind == "deepspeed" and zero_stage == 3)


# the checkpoint format each kind writes: DDP and FSDP2 write engine-neutral DCP state (either loads the other's, on
# any number of ranks); DeepSpeed its own files
CHECKPOINT_FORMATS = {"ddp": "DCP", "fsdp2": "DCP", "deepspeed": "DeepSpeed's own files"}


def runs_as(kind: str, world: int, shard_size: int, unsharded_ddp: bool = True) -> str:
    """The kind that runs engine.kind `kind` on `world` ranks, the one rule the engine's build, the start-up line,
    `scale plan` and `scale submit` apply: FSDP2 whose shard group is one rank (one rank in all, or
    engine.shard_size 1: plain replication) shards nothing yet pays for FSDP2's hooks and DTensor parameters on
    every step (DINO ViT-S/16 bf16 on one CPU rank, `scale bench host`: 2,802 ops that launch device work a step,
    DDP 1,440), so DDP runs the same step (with its fused low-precision weight copies) unless engine.unsharded_ddp
    is false."""
    if kind == "fsdp2" and unsharded_ddp and (world == 1 or shard_size == 1):
        return "ddp"
    return kind


def describe(kind: str, ran: str, world: int) -> str:
    """What runs, and why when it is not engine.kind: 'ddp (fsdp2 on one rank)'."""
    if ran == kind:
        return kind
    return f"{ran} ({kind} on one rank)" if world == 1 else f"{ran} ({kind} with engine.shard_size 1)"


def recipe_setting(
    kind: str, zero_stage: int, shard_size: int, nodes: int, ranks_per_node: int, unsharded_ddp: bool = True
) -> tuple[str, int]:
    """The engine setting a recipe runs with on `nodes` x `ranks_per_node` ranks, as (setting, engine.shard_size):
    the one rule that `scale submit` applies (it adds the shard size to the tasks' overrides) and that `scale plan`
    proposes. Several nodes and an engine that shards the parameters with engine.shard_size 0 (all ranks): shard
    within each node (FSDP2 -> HSDP; ZeRO-3 -> ZeRO++ hpZ), so that the per-layer all-gathers and reduce-scatters
    stay on the node's links and only one gradient all-reduce per step crosses nodes. The setting is a key of
    SETTINGS, or "hsdp" (fsdp2 sharded over fewer ranks than all); "ddp" for fsdp2 on a shard group of one rank
    (`runs_as`; the shard size stays, so that the launched ranks resolve the same group)."""
    if nodes > 1 and shard_size == 0 and shards_parameters(kind, zero_stage):
        shard_size = ranks_per_node
    kind = runs_as(kind, nodes * ranks_per_node, shard_size, unsharded_ddp)
    if kind == "deepspeed":
        return f"zero{zero_stage}", shard_size
    if kind == "fsdp2" and 0 < shard_size < nodes * ranks_per_node:
        return "hsdp", shard_size
    return kind, shard_size

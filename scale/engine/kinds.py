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


def recipe_setting(kind: str, zero_stage: int, shard_size: int, nodes: int, ranks_per_node: int) -> tuple[str, int]:
    """The engine setting a recipe runs with on `nodes` x `ranks_per_node` ranks, as (setting, engine.shard_size):
    the one rule that `scale submit` applies (it adds the shard size to the tasks' overrides) and that `scale plan`
    proposes. Several nodes and an engine that shards the parameters with engine.shard_size 0 (all ranks): shard
    within each node (FSDP2 -> HSDP; ZeRO-3 -> ZeRO++ hpZ), so that the per-layer all-gathers and reduce-scatters
    stay on the node's links and only one gradient all-reduce per step crosses nodes. The setting is a key of
    SETTINGS, or "hsdp" (fsdp2 sharded over fewer ranks than all)."""
    if nodes > 1 and shard_size == 0 and shards_parameters(kind, zero_stage):
        shard_size = ranks_per_node
    if kind == "deepspeed":
        return f"zero{zero_stage}", shard_size
    if kind == "fsdp2" and 0 < shard_size < nodes * ranks_per_node:
        return "hsdp", shard_size
    return kind, shard_size

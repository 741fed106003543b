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


def setting_overrides(label: str) -> list[str]:
    """Recipe overrides of an engine setting ('zero3' -> engine.kind=deepspeed engine.zero_stage=3)."""
    return [f"engine.{key}={value}" for key, value in SETTINGS[label].items()]

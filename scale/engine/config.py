"""Recipe sections `engine` (how modules are wrapped and stepped) and `optim` (optimizer and schedules)."""

from dataclasses import dataclass, field


@dataclass
class EngineConfig:
    kind: str = "fsdp2"  # ddp | fsdp2 | deepspeed
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fp16 needs a GPU)
    activation_checkpointing: str = "none"  # none | full | every_n | selective (see scale/engine/activation.py)
    ac_every_n: int = 2
    zero_stage: int = 1  # deepspeed only
    grad_accum: int = 1
    reshard_after_forward: bool = True  # fsdp2: free gathered block parameters after forward (the root keeps them)
    sync_bn: bool = True  # GPU, world > 1: BatchNorm -> SyncBatchNorm, as DINO and MoCo v3 do (no SyncBN on CPU)
    find_unused_parameters: bool = False  # ddp: needed when some student parameters get no gradient in a step
    # build the modules on the meta device and initialise them after sharding, so that no rank ever holds the
    # whole model (ViT-L/7, ViT-H, Swin-B/W14 under fsdp2); each rank draws its own shards' random init
    meta_init: bool = False


@dataclass
class OptimConfig:
    name: str = "adamw"  # adamw | lars | lamb | sgd
    lr: float = 5e-4  # base learning rate at ref_batch
    lr_scaling: str = "linear"  # linear | sqrt | none: lr * scale(global_batch / ref_batch)
    ref_batch: int = 256
    min_lr: float = 1e-6
    warmup_epochs: float = 10
    warmup_start_lr: float = 0.0
    weight_decay: float = 0.04
    weight_decay_end: float = 0.4
    wd_exclude_1d: bool = True  # no weight decay on biases and 1-D parameters
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    momentum: float = 0.9
    clip_grad: float = 3.0  # 0 disables
    clip_mode: str = "per_param"  # per_param (DINO's official rule) | global

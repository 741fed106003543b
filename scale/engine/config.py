"""Recipe sections `engine` (how modules are wrapped and stepped) and `optim` (optimizer and schedules)."""

from dataclasses import dataclass

from scale.config.fields import FIXED, NOTED, above, at_least, below, choice, listed_in, within
from scale.engine.kinds import KINDS, ZERO_STAGES


@dataclass
class EngineConfig:
    # how the modules are wrapped and stepped: ddp | fsdp2 | deepspeed (Engines and the training step). ddp and
    # fsdp2 write the same DCP checkpoints, so a run may resume under the other (noted); deepspeed's own files are
    # refused by both
    kind: str = choice("fsdp2", tuple(KINDS), resume=NOTED)
    # fsdp2 on a shard group of one rank (one GPU, or shard_size 1: plain replication) runs as ddp, the same step
    # without FSDP2's hooks and DTensor parameters (about half the device launches of a ViT-S/16 step) and with
    # ddp's fused low-precision weight copies; the start-up line says so (scale.engine.kinds.runs_as). false: keep
    # FSDP2 (to study FSDP2 itself on one GPU)
    unsharded_ddp: bool = True
    # the training precision: fp32, bf16, fp16 (GPU only)
    precision: str = choice("fp32", listed_in("scale.engine.precision", "DTYPES", ("fp32", "bf16", "fp16")))
    # fp16: the dynamic loss scale starts at 2**loss_scale_power (halved after each overflow, which skips that
    # update). 16: torch's GradScaler default, which DINO and MoCo v3 use, and DeepSpeed's initial_scale_power
    loss_scale_power: int = within(16, 0, 32)
    # none, full, every_n, selective: see scale/engine/activation_checkpointing.py
    activation_checkpointing: str = choice(
        "none", listed_in("scale.engine.activation_checkpointing", "MODES", ("none", "full", "every_n", "selective"))
    )
    # activation_checkpointing every_n: checkpoint every n-th block
    ac_every_n: int = at_least(2, 1)
    # torch.compile per transformer block and head (see scale/engine/compile.py): ddp, fsdp2, deepspeed ZeRO-1/2.
    # compile_backend: inductor (generated kernels) or aot_eager (the same graphs on eager kernels: to tell a
    # kernel problem from a tracing one, and cheap to compile for tests)
    compile: bool = False
    # torch.compile's backend (see compile)
    compile_backend: str = choice("inductor", ["inductor", "aot_eager"])
    # torch.compile's mode (inductor only): reduce-overhead records each compiled block's and head's kernels in a CUDA
    # graph and replays them with one launch, for steps bound by the host (DINO ViT-S/16 at 64 images on an H200:
    # device busy 24%; with it 1,234 images/s against 872 eager, 2026-11-28; each step is one generation of the
    # graphs: scale.engine.compile.begin_graph_step); measured under DDP (fsdp2 on one GPU runs as DDP), not yet
    # where FSDP2 shards (it gathers and frees each block's weights around it) or under DeepSpeed; max-autotune
    # searches matmul kernels (minutes of compile) and replays CUDA graphs too; default: neither
    compile_mode: str = choice("default", ["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"])
    # what torch.compile compiles (scale/engine/compile.py): each block and head (blocks: one graph per block, as
    # torchtitan; the engine's per-block hooks and communication stay between them), or each net's whole forward
    # (net: every crop group, block and head of one call in one graph, no eager glue between blocks and a few
    # CUDA graph replays per step instead of one per block; for DDP, where nothing hooks a block). An assumption
    # to measure: no GPU has run "net" yet (the device check's bench has it)
    compile_scope: str = choice("blocks", ["blocks", "net"])
    zero_stage: int = choice(1, ZERO_STAGES, resume=FIXED)  # deepspeed only: 1, 2, 3
    # micro-batches accumulated per optimizer step
    grad_accum: int = at_least(1, 1)
    # fsdp2: shard each parameter over groups of shard_size ranks and replicate across the groups (HSDP; one node's
    # GPUs per group keeps the all-gathers and reduce-scatters on the fast links); 0 = all ranks (plain FSDP).
    # deepspeed: ZeRO++ hierarchical partitioning (zero_hpz_partition_size), ZeRO-3 only
    shard_size: int = at_least(0, 0)
    reshard_after_forward: bool = True  # fsdp2: free gathered block parameters after forward (the root keeps them)
    sync_bn: bool = True  # GPU, world > 1: BatchNorm -> SyncBatchNorm, as DINO and MoCo v3 do (no SyncBN on CPU)
    find_unused_parameters: bool = False  # ddp: needed when some student parameters get no gradient in a step
    # build the modules on the meta device and initialise them after sharding, so that no rank ever holds the
    # whole model (ViT-L/7, ViT-H, Swin-B/W14 under fsdp2); each rank draws its own shards' random init
    meta_init: bool = False


@dataclass
class OptimConfig:
    # the optimizer: adamw, lars, lamb, sgd
    name: str = choice("adamw", listed_in("scale.optim", "OPTIMIZERS", ("adamw", "lars", "lamb", "sgd")), resume=FIXED)
    lr: float = at_least(5e-4, 0.0)  # base learning rate at ref_batch
    lr_scaling: str = choice("linear", ["linear", "sqrt", "none"])  # lr * scale(global_batch / ref_batch)
    # the batch that lr is given for (lr_scaling scales it by global_batch / ref_batch)
    ref_batch: int = at_least(256, 1)
    # the learning rate at the end of the cosine
    min_lr: float = at_least(1e-6, 0.0)
    # epochs of the linear lr warm-up
    warmup_epochs: float = at_least(10, 0)
    # the learning rate at the warm-up's first step
    warmup_start_lr: float = at_least(0.0, 0.0)
    # True: the base lr is reached at the last warmup step (DINO's cosine_scheduler, np.linspace); False: at the
    # first step after it, lr * t / warmup (MoCo v3's main_moco.py, timm's scheduler in DRLoc)
    warmup_endpoint: bool = True
    # True: the half cosine starts after the warm-up (DINO, MoCo v3); False: timm's CosineLRScheduler without
    # warmup_prefix (DeiT, Swin/DRLoc): the cosine runs over the whole schedule and the warm-up replaces its start
    warmup_prefix: bool = True
    # epochs the lr schedule spans; None: train.epochs. DRLoc's main.py builds it over --total_epochs 300 and its
    # loop stops at epoch 100, so the lr never decays fully
    lr_schedule_epochs: int | None = at_least(None, 1)
    # iteration: a new lr every step; epoch: one per epoch (timm's scheduler as DeiT's main.py steps it)
    lr_step: str = choice("iteration", ["iteration", "epoch"])
    # steps (or epochs, with lr_step: epoch) the lr trails its schedule, the first ones keeping its start: 1 for
    # timm's scheduler as DeiT and Swin call it, after each epoch / update, setting the next one's lr
    lr_lag: int = at_least(0, 0)
    # weight decay at the start (cosine to weight_decay_end)
    weight_decay: float = at_least(0.04, 0.0)
    # weight decay at the end of the training
    weight_decay_end: float = at_least(0.4, 0.0)
    wd_exclude_1d: bool = True  # no weight decay on biases and 1-D parameters
    betas: list[float] = below([0.9, 0.999], 0.0, 1.0)  # torch's optimizers refuse 1.0 and more
    # the optimizer's epsilon (AdamW, LAMB)
    eps: float = above(1e-8, 0.0)
    # momentum of SGD and LARS
    momentum: float = at_least(0.9, 0.0)
    clip_grad: float = at_least(3.0, 0.0)  # 0 disables
    # per_param (DINO's official rule) | global
    clip_mode: str = choice("per_param", listed_in("scale.engine.clip", "CLIP_MODES", ("per_param", "global")))

"""What a step trace records (scale.bench.trace counts it on fake tensors) and the recipe it is traced from: plain
numbers and OmegaConf, no torch, so that the planner can read a cached trace (scale.bench.trace_cache) without
importing torch or timm."""

from dataclasses import dataclass, field

from omegaconf import OmegaConf

TRACE_IMAGES = 2  # BatchNorm heads (MoCo v3) need more than one image per view


@dataclass
class BlockCall:
    index: int  # block position in its backbone
    saved: int = 0  # bytes saved for backward inside this call
    inputs: int = 0  # bytes of the call's input
    flops: int = 0


@dataclass
class StepTrace:
    images: int
    student_flops: int = 0  # forward FLOPs of every student call of the step (all crops)
    teacher_flops: int = 0
    net_saved: int = 0  # bytes the student's forward saves for backward, less its weights cast by autocast
    # bytes of the student's parameters cast by autocast and saved for backward: one cast per weight and step (the
    # cache shares it between calls), whatever the batch
    weight_casts: int = 0
    loss_saved: int = 0  # bytes the loss arithmetic outside the nets saves
    largest_saved: int = 0  # the largest single saved storage
    blocks: list[BlockCall] = field(default_factory=list)  # the student's block calls, in order
    student_calls: int = 0  # forwards of the student net in the step
    teacher_calls: int = 0
    block_params: int = 0  # student parameters inside transformer blocks (gathered per backbone call by FSDP)
    depth: int = 0  # transformer blocks of the student
    input_bytes: int = 0  # the batch's crops
    params: int = 0  # student parameters (all)
    trainable: int = 0
    teacher_params: int = 0
    # elements of the Linear and Conv weights and biases (scale.engine.lowp.cast_parameters): the student's
    # trainable ones and the teacher's, of which the DDP engine keeps copies in the autocast dtype
    student_cast: int = 0
    teacher_cast: int = 0
    buffers: int = 0  # bytes of student + teacher buffers

    def per_image(self, value: float) -> float:
        return value / self.images


def trace_config(cfg, images: int = TRACE_IMAGES, dp_size: int = 1, shard_size: int = 1):
    """The recipe as the trace runs it: `images` images per rank at the epoch where any region loss has started, nets
    built on the meta device and traced whole (no checkpointing: the planner models it), no monitors. Everything
    the trace reads is in it, so its hash keys the trace cache."""
    epoch = int(cfg.method.esvit.region_from_epoch)
    batch = images * dp_size
    return OmegaConf.merge(
        cfg,
        {
            "engine": {
                "meta_init": True,
                "grad_accum": 1,
                "activation_checkpointing": "none",
                "shard_size": shard_size,
            },
            "train": {
                "global_batch": batch,
                "samples_per_epoch": batch,
                "epochs": epoch + 1,
                "knn_monitor_every": 0,
                "grad_monitor_every": 0,
            },
        },
    )

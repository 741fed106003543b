"""Recipe section `method`: which self-supervised (or supervised) objective, with one sub-section each."""

from dataclasses import dataclass, field


@dataclass
class DinoConfig:
    out_dim: int = 65536
    hidden_dim: int = 2048
    bottleneck_dim: int = 256
    head_layers: int = 3
    use_bn_in_head: bool = False
    norm_last_layer: bool = True
    student_temp: float = 0.1
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0
    center_momentum: float = 0.9
    momentum_teacher: float = 0.996  # cosine to 1
    freeze_last_layer: int = 1  # epochs
    # DINO Table 7 variants
    teacher: str = "ema"  # ema | copy (row 2, no momentum: the teacher is the current student)
    centering: str = "center"  # center | sinkhorn (row 3)
    sinkhorn_iters: int = 3
    loss: str = "ce"  # ce | mse (row 5: squared error between teacher and student probabilities)
    predictor: bool = False  # row 6: 2-layer MLP on the student's bottleneck
    # EsViT region loss
    region_weight: float = 0.5
    region_from_epoch: int = 0


@dataclass
class MocoConfig:
    variant: str = "mocov3"  # mocov3 | mocov2 | simclr | byol | swav
    dim: int = 256
    mlp_dim: int = 4096
    proj_layers: int = 3
    pred_layers: int = 2
    temperature: float = 0.2
    momentum: float = 0.99  # cosine to 1 when momentum_cosine
    momentum_cosine: bool = True
    bn_in_heads: bool = True
    # MoCo v3 appendix: per_view = the two crops of an image never share a BN batch (Alg. 1); joint = one batch
    bn_batching: str = "per_view"  # per_view | joint
    # SwAV (MoCo v3 Table 4): prototypes on the projection, Sinkhorn-Knopp codes, no queue
    swav_prototypes: int = 3000
    swav_epsilon: float = 0.05
    swav_temperature: float = 0.1
    swav_freeze_prototypes_steps: int = 313
    sinkhorn_iters: int = 3
    # MoCo v2 (DINO Table 7 row 8): negatives from a queue of past keys of every rank
    queue_size: int = 65536


@dataclass
class DrlocConfig:
    pairs: int = 64
    weight: float = 0.5  # lambda: 0.5 for Swin, 0.1 for others
    mode: str = "l1"  # l1 (Eq. 2) | signed (Eq. 3) | ce (Eq. 5) | gaussian (Eq. 6)
    every_block: bool = False  # Eq. 7: one localization MLP per block
    exhaustive: bool = False  # Eq. 8: every embedding once, with a random partner
    grid: int = 7  # grids larger than this are average-pooled to it
    normalize_targets: bool = True  # the paper divides offsets by k (Eq. 1); the official code does not
    gaussian_alpha: float = 0.001  # alpha of Eq. 6 (the official code's variance weight)
    hidden_dim: int = 512


@dataclass
class SupervisedConfig:
    label_smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0


@dataclass
class MethodConfig:
    # dino | esvit | mocov3 | drloc | supervised; kind mocov3 runs the framework named by moco.variant
    kind: str = "dino"
    dino: DinoConfig = field(default_factory=DinoConfig)
    moco: MocoConfig = field(default_factory=MocoConfig)
    drloc: DrlocConfig = field(default_factory=DrlocConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)

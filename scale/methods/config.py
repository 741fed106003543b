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
    # The official code (yhlleo/VTs-Drloc, which produced the tables) departs from the paper's text; each departure
    # is a switch whose default is the official behaviour (recipes/README.md, departures):
    # avg3x3s2: nn.AvgPool2d(3, stride 2, padding 1, count_include_pad False) of T2T/CvT 14x14 grids (official);
    # avg2x2: the paper's 2x2 average pooling (Sec. 3)
    pool: str = "avg3x3s2"
    normalize_targets: bool = False  # the paper divides offsets by k (Eq. 1); the official code does not
    # True: |delta| targets in every mode (official train.sh --use_abs), ce/gaussian then have k classes 0..k-1;
    # False: Eq. 4's signed classes {-k..k}. Mode `signed` (Eq. 3) is the official run without --use_abs
    use_abs: bool = True
    l1_reduction: str = "mean"  # mean: over u and v (official F.l1_loss); sum: Eq. 2's |.|_1 (twice the loss)
    gaussian_alpha: float = 0.001  # alpha of Eq. 6 (the official code's lambda_var)
    gaussian_log: str = "variance"  # variance: alpha log sigma^2 (official); sigma: Eq. 6's alpha log sigma
    # ce/gaussian head: the official trunk has a third Linear(512, 512) (no ReLU after it) before the two class
    # layers; the paper's MLP (App. D) has two hidden layers
    class_head_extra_linear: bool = True
    # lambda over epochs: ramp (official main.py _weight_decay: 0 -> lambda over weight_warmup_epochs, then linear
    # to 0 at weight_total_epochs, --total_epochs 300 while the loop stops at epoch 100) | constant (the paper)
    weight_schedule: str = "ramp"
    weight_warmup_epochs: int = 20
    weight_total_epochs: int = 300
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

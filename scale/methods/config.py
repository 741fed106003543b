"""Recipe section `method`: which self-supervised (or supervised) objective, with one sub-section each."""

from dataclasses import dataclass, field

from scale.config.fields import FIXED, at_least, choice, listed_in, plain, within
from scale.methods import registry


@dataclass
class DinoConfig:
    # K: the DINO head's output width
    out_dim: int = at_least(65536, 1, resume=FIXED)
    # hidden width of the head's MLP
    hidden_dim: int = at_least(2048, 1, resume=FIXED)
    # width of the bottleneck before the head's last (weight-normalised) layer
    bottleneck_dim: int = at_least(256, 1, resume=FIXED)
    # linear layers of the head's MLP
    head_layers: int = at_least(3, 1, resume=FIXED)
    # BatchNorm in the head's MLP
    use_bn_in_head: bool = plain(False, FIXED)
    # the head's last layer keeps its weight norm fixed at 1 (False: the norm is trained)
    norm_last_layer: bool = plain(True, FIXED)
    # temperature of the student's softmax
    student_temp: float = at_least(0.1, 1e-8)
    # temperature of the teacher's softmax after its warm-up
    teacher_temp: float = at_least(0.04, 1e-8)
    # the teacher's temperature at the start, rising linearly to teacher_temp
    warmup_teacher_temp: float = at_least(0.04, 1e-8)
    # epochs of that warm-up
    warmup_teacher_temp_epochs: int = at_least(0, 0)
    # EMA rate of the center subtracted from the teacher's output
    center_momentum: float = within(0.9, 0.0, 1.0)
    momentum_teacher: float = within(0.996, 0.0, 1.0)  # cosine to 1
    freeze_last_layer: int = at_least(1, 0)  # epochs
    # DINO Table 7 variants
    teacher: str = choice("ema", ["ema", "copy"])  # copy: row 2, no momentum, the teacher is the student
    centering: str = choice("center", ["center", "sinkhorn"])  # sinkhorn: row 3
    # Sinkhorn-Knopp iterations of centering: sinkhorn
    sinkhorn_iters: int = at_least(3, 1)
    loss: str = choice("ce", ["ce", "mse"])  # mse: row 5, squared error between teacher and student probabilities
    predictor: bool = plain(False, FIXED)  # row 6: 2-layer MLP on the student's bottleneck
    # EsViT region loss: w, its weight ((1 - w) for DINO's view loss)
    region_weight: float = 0.5
    # EsViT: the epoch from which the region loss is added (before it, the view loss alone)
    region_from_epoch: int = at_least(0, 0)


@dataclass
class MocoConfig:
    # the heads and losses of method.kind mocov3, mocov2, simclr, byol and swav (MoCo v3 Table 4, DINO Table 7)
    dim: int = at_least(256, 1, resume=FIXED)  # output width of the projector and the predictor
    # hidden width of the projector and predictor MLPs
    mlp_dim: int = at_least(4096, 1, resume=FIXED)
    # linear layers of the projector
    proj_layers: int = at_least(3, 1, resume=FIXED)
    # linear layers of the predictor (0: none)
    pred_layers: int = at_least(2, 0, resume=FIXED)
    # temperature of the contrastive (InfoNCE) loss
    temperature: float = at_least(0.2, 1e-8)
    momentum: float = within(0.99, 0.0, 1.0)  # cosine to 1 when momentum_cosine
    # the momentum rises to 1 along a half cosine over the training
    momentum_cosine: bool = True
    # BatchNorm in the projector and predictor MLPs
    bn_in_heads: bool = plain(True, FIXED)
    # MoCo v3 appendix: per_view = the two crops of an image never share a BN batch (Alg. 1); joint = one batch
    bn_batching: str = choice("per_view", ["per_view", "joint"])
    # SwAV (MoCo v3 Table 4): prototypes on the projection, Sinkhorn-Knopp codes, no queue
    swav_prototypes: int = at_least(3000, 1, resume=FIXED)
    # SwAV: entropy regularisation of the Sinkhorn-Knopp codes
    swav_epsilon: float = 0.05
    # SwAV: temperature of the softmax over the prototype scores
    swav_temperature: float = 0.1
    # SwAV: the first steps, during which the prototypes are not updated
    swav_freeze_prototypes_steps: int = 313
    # SwAV: Sinkhorn-Knopp iterations
    sinkhorn_iters: int = at_least(3, 1)
    # MoCo v2 (DINO Table 7 row 8): negatives from a queue of past keys of every rank
    queue_size: int = at_least(65536, 1, resume=FIXED)


@dataclass
class DrlocConfig:
    # m: pairs of embeddings drawn per image
    pairs: int = at_least(64, 1)
    weight: float = 0.5  # lambda: 0.5 for Swin, 0.1 for others
    # l1 Eq. 2 | signed Eq. 3 | ce Eq. 5 | gaussian Eq. 6
    mode: str = choice(
        "l1", listed_in("scale.methods.drloc", "MODES", ("l1", "signed", "ce", "gaussian")), resume=FIXED
    )
    every_block: bool = plain(False, FIXED)  # Eq. 7: one localization MLP per block
    exhaustive: bool = False  # Eq. 8: every embedding once, with a random partner
    grid: int = at_least(7, 1)  # grids larger than this are average-pooled to it
    # The official code (yhlleo/VTs-Drloc, which produced the tables) departs from the paper's text; each departure
    # is a switch whose default is the official behaviour (recipes/README.md, departures):
    # avg3x3s2: nn.AvgPool2d(3, stride 2, padding 1, count_include_pad False) of T2T/CvT 14x14 grids (official);
    # avg2x2: the paper's 2x2 average pooling (Sec. 3)
    pool: str = choice("avg3x3s2", ["avg3x3s2", "avg2x2"])
    normalize_targets: bool = False  # the paper divides offsets by k (Eq. 1); the official code does not
    # True: |delta| targets in every mode (official train.sh --use_abs), ce/gaussian then have k classes 0..k-1;
    # False: Eq. 4's signed classes {-k..k}. Mode `signed` (Eq. 3) is the official run without --use_abs
    use_abs: bool = True
    # mean: over u and v (official F.l1_loss); sum: Eq. 2's |.|_1 (twice the loss)
    l1_reduction: str = choice("mean", ["mean", "sum"])
    gaussian_alpha: float = 0.001  # alpha of Eq. 6 (the official code's lambda_var)
    # variance: alpha log sigma^2 (official); sigma: Eq. 6's alpha log sigma
    gaussian_log: str = choice("variance", ["variance", "sigma"])
    # ce/gaussian head: the official trunk has a third Linear(512, 512) (no ReLU after it) before the two class
    # layers; the paper's MLP (App. D) has two hidden layers
    class_head_extra_linear: bool = True
    # lambda over epochs: ramp (official main.py _weight_decay: 0 -> lambda over weight_warmup_epochs, then linear
    # to 0 at weight_total_epochs, --total_epochs 300 while the loop stops at epoch 100) | constant (the paper)
    weight_schedule: str = choice("ramp", ["ramp", "constant"])
    # weight_schedule ramp: epochs from 0 to lambda
    weight_warmup_epochs: int = at_least(20, 0)
    # weight_schedule ramp: the epoch at which lambda is back at 0
    weight_total_epochs: int = at_least(300, 1)
    # hidden width of the localization MLP
    hidden_dim: int = at_least(512, 1, resume=FIXED)


@dataclass
class SupervisedConfig:
    # label smoothing of the cross-entropy
    label_smoothing: float = within(0.1, 0.0, 1.0)
    # mixup's alpha (0: no mixup)
    mixup: float = at_least(0.8, 0.0)
    # cutmix's alpha (0: no cutmix)
    cutmix: float = at_least(1.0, 0.0)


# the sub-sections of `method` each kind reads (`scale recipes show` prints only those); the others read `moco`
SECTIONS = {"dino": ("dino",), "esvit": ("dino",), "drloc": ("drloc", "supervised"), "supervised": ("supervised",)}


def method_sections(kind: str) -> tuple[str, ...]:
    return SECTIONS.get(kind, ("moco",))


@dataclass
class MethodConfig:
    # the declared methods (scale/methods/registry.py KINDS): dino, esvit, mocov3, mocov2, simclr, byol, swav, drloc, ...
    kind: str = choice("dino", tuple(registry.KINDS), resume=FIXED)
    dino: DinoConfig = field(default_factory=DinoConfig)
    moco: MocoConfig = field(default_factory=MocoConfig)
    drloc: DrlocConfig = field(default_factory=DrlocConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)

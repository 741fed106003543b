"""Recipe section `method`: which self-supervised (or supervised) objective, with one sub-section each."""

import dataclasses
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


@dataclass
class EsvitConfig:
    """EsViT is DINO plus a region loss: it reads method.dino (the view loss, both heads) and this section."""

    # w, the region loss's weight ((1 - w) for DINO's view loss)
    region_weight: float = 0.5
    # the epoch from which the region loss is added (before it, the view loss alone)
    region_from_epoch: int = at_least(0, 0)


# The frameworks of MoCo v3 Table 4 and DINO Table 7 rows 7-8, one section each; the small bases below hold the
# fields several of them share (each kind's section has only the fields its class reads)
MOCO_KINDS = ("mocov3", "mocov2", "simclr", "byol", "swav")


@dataclass
class ProjectorConfig:
    dim: int = at_least(256, 1, resume=FIXED)  # output width of the projector (and of the predictor)
    # hidden width of the projector (and predictor) MLPs
    mlp_dim: int = at_least(4096, 1, resume=FIXED)


@dataclass
class MomentumConfig:
    # EMA rate of the momentum encoder
    momentum: float = within(0.99, 0.0, 1.0)  # cosine to 1 when momentum_cosine
    # the momentum rises to 1 along a half cosine over the training
    momentum_cosine: bool = True


@dataclass
class ViewBatchingConfig:
    # MoCo v3 appendix: per_view = the two crops of an image never share a BN batch (Alg. 1); joint = one batch
    bn_batching: str = choice("per_view", ["per_view", "joint"])


@dataclass
class HeadBatchNormConfig(ViewBatchingConfig):
    # BatchNorm in the projector and predictor MLPs
    bn_in_heads: bool = plain(True, FIXED)


@dataclass
class ContrastiveConfig:
    # temperature of the contrastive loss (InfoNCE, NT-Xent)
    temperature: float = at_least(0.2, 1e-8)


@dataclass
class MocoV3Config(ContrastiveConfig, HeadBatchNormConfig, MomentumConfig, ProjectorConfig):
    # linear layers of the projector (ViT; the ResNet projector has MoCo v3's fixed depth)
    proj_layers: int = at_least(3, 1, resume=FIXED)
    # linear layers of the predictor (0: none)
    pred_layers: int = at_least(2, 0, resume=FIXED)


@dataclass
class MocoV2Config(ContrastiveConfig, MomentumConfig, ProjectorConfig):
    # DINO Table 7 row 8: negatives from a queue of past keys of every rank
    queue_size: int = at_least(65536, 1, resume=FIXED)


@dataclass
class SimclrConfig(ContrastiveConfig, HeadBatchNormConfig, ProjectorConfig):
    # linear layers of the projector (ViT; the ResNet projector has MoCo v3's fixed depth)
    proj_layers: int = at_least(3, 1, resume=FIXED)


@dataclass
class ByolConfig(HeadBatchNormConfig, MomentumConfig, ProjectorConfig):
    """BYOL's heads have 2 layers each (MoCo v3 appendix): no layer counts to set."""


@dataclass
class SwavConfig(ViewBatchingConfig, ProjectorConfig):
    # MoCo v3 Table 4: prototypes on the projection, Sinkhorn-Knopp codes, no queue
    prototypes: int = at_least(3000, 1, resume=FIXED)
    # entropy regularisation of the Sinkhorn-Knopp codes
    epsilon: float = 0.05
    # temperature of the softmax over the prototype scores
    temperature: float = 0.1
    # the first steps, during which the prototypes are not updated
    freeze_prototypes_steps: int = 313
    # Sinkhorn-Knopp iterations
    sinkhorn_iters: int = at_least(3, 1)


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


def method_sections(kind: str) -> tuple[str, ...]:
    """The sub-sections of `method` that `kind` reads (`scale recipes show` prints only those): its own, then those
    of the kind it extends (EsViT: DINO's, DRLoc: supervised's)."""
    extends = registry.KINDS[kind].extends
    return (kind,) + (method_sections(extends) if extends else ())


# Sections of earlier releases that held other kinds' settings (read as today's by scale/config/load.py, with a
# deprecation notice): method.moco held the settings of the MOCO_KINDS, method.dino EsViT's region fields
MOVED_KEYS = {"dino": {"region_weight": "esvit", "region_from_epoch": "esvit"}}  # {section: {key: its kind now}}
OLD_MOCO = (
    "dim mlp_dim proj_layers pred_layers temperature momentum momentum_cosine bn_in_heads bn_batching swav_prototypes "
    "swav_epsilon swav_temperature swav_freeze_prototypes_steps sinkhorn_iters queue_size"
).split()
# method.moco's keys under another name in a kind's own section; None: the kind never read it
MOCO_RENAMED = {
    "swav": {
        "temperature": None,  # the contrastive loss's, not SwAV's softmax temperature
        "swav_prototypes": "prototypes",
        "swav_epsilon": "epsilon",
        "swav_temperature": "temperature",
        "swav_freeze_prototypes_steps": "freeze_prototypes_steps",
    }
}


def moco_key(kind: str, key: str) -> str | None:
    """Where method.moco.`key` of an earlier release is read today with method.kind=`kind`: a key of method.<kind>,
    or None where `kind` never read it. A key no release had moves as it is, for the loader to name."""
    if kind not in MOCO_KINDS:
        return None
    new = MOCO_RENAMED.get(kind, {}).get(key, key)
    if key in OLD_MOCO and new not in {f.name for f in dataclasses.fields(SECTION_TYPES[kind])}:
        return None
    return new


@dataclass
class MethodConfig:
    # the declared methods (scale/methods/registry.py KINDS): dino, esvit, mocov3, mocov2, simclr, byol, swav, drloc, ...
    kind: str = choice("dino", tuple(registry.KINDS), resume=FIXED)
    # one section per kind, named after it: the settings its class reads
    dino: DinoConfig = field(default_factory=DinoConfig)
    esvit: EsvitConfig = field(default_factory=EsvitConfig)
    mocov3: MocoV3Config = field(default_factory=MocoV3Config)
    mocov2: MocoV2Config = field(default_factory=MocoV2Config)
    simclr: SimclrConfig = field(default_factory=SimclrConfig)
    byol: ByolConfig = field(default_factory=ByolConfig)
    swav: SwavConfig = field(default_factory=SwavConfig)
    drloc: DrlocConfig = field(default_factory=DrlocConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)


SECTION_TYPES = {f.name: f.type for f in dataclasses.fields(MethodConfig) if f.name != "kind"}

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
    centering: str = "center"  # center | sinkhorn
    loss: str = "ce"  # ce | mse
    predictor: bool = False
    # EsViT region loss
    region_weight: float = 0.5
    region_from_epoch: int = 0


@dataclass
class MocoConfig:
    variant: str = "mocov3"  # mocov3 | simclr | byol | swav
    dim: int = 256
    mlp_dim: int = 4096
    proj_layers: int = 3
    pred_layers: int = 2
    temperature: float = 0.2
    momentum: float = 0.99  # cosine to 1 when momentum_cosine
    momentum_cosine: bool = True
    bn_in_heads: bool = True


@dataclass
class DrlocConfig:
    pairs: int = 64
    weight: float = 0.5  # lambda: 0.5 for Swin, 0.1 for others
    mode: str = "l1"  # l1 | signed | ce | gaussian
    every_block: bool = False
    exhaustive: bool = False
    grid: int = 7


@dataclass
class SupervisedConfig:
    label_smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0


@dataclass
class MethodConfig:
    kind: str = "dino"  # dino | esvit | mocov3 | drloc | supervised
    dino: DinoConfig = field(default_factory=DinoConfig)
    moco: MocoConfig = field(default_factory=MocoConfig)
    drloc: DrlocConfig = field(default_factory=DrlocConfig)
    supervised: SupervisedConfig = field(default_factory=SupervisedConfig)

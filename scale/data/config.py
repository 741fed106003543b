"""Recipe section `data`: where the shards are, how they are read, and which views are made."""

from dataclasses import dataclass, field


@dataclass
class ViewsConfig:
    # multicrop (DINO/EsViT) | two_view (MoCo v3/BYOL/SimCLR) | supervised (DRLoc, fine-tuning) | eval
    kind: str = "multicrop"
    n_global: int = 2
    global_size: int = 224
    global_scale: list[float] = field(default_factory=lambda: [0.4, 1.0])
    # several local sizes are allowed (EsViT); n_local[i] crops of local_sizes[i] px
    local_sizes: list[int] = field(default_factory=lambda: [96])
    n_local: list[int] = field(default_factory=lambda: [8])
    local_scale: list[float] = field(default_factory=lambda: [0.05, 0.4])
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    interpolation: str = "bicubic"
    flip_p: float = 0.5
    color_jitter: list[float] = field(default_factory=lambda: [0.4, 0.4, 0.2, 0.1])
    color_jitter_p: float = 0.8
    grayscale_p: float = 0.2
    # per global view (view 1, view 2); locals use local_blur_p / local_solarize_p
    blur_p: list[float] = field(default_factory=lambda: [1.0, 0.1])
    solarize_p: list[float] = field(default_factory=lambda: [0.0, 0.2])
    local_blur_p: float = 0.5
    local_solarize_p: float = 0.0
    blur_sigma: list[float] = field(default_factory=lambda: [0.1, 2.0])
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    # supervised views (timm transform factory)
    auto_augment: str = "rand-m9-mstd0.5-inc1"
    random_erase_p: float = 0.25
    # evaluation views
    eval_resize: int = 256
    eval_crop: int = 224


@dataclass
class DataConfig:
    # a shard directory with an _info.json manifest; ${oc.env:SCALE_DATA,data} lets a cluster point elsewhere
    train: str = "${oc.env:SCALE_DATA,data}/imagenet1k/train"
    val: str = "${oc.env:SCALE_DATA,data}/imagenet1k/val"
    backend: str = "torchvision"  # torchvision | dali (extra `dali`; multicrop and two_view views)
    dali_device: str = "auto"  # auto (the GPU when CUDA is available) | gpu | cpu
    mode: str = "epochs"  # epochs (every sample once per epoch) | resampled (infinite stream)
    workers: int = 4
    shuffle_buffer: int = 2000
    error_budget: float = 0.001  # fraction of samples that may be bad before the run stops
    num_classes: int = 1000
    views: ViewsConfig = field(default_factory=ViewsConfig)

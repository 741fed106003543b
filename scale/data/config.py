"""Recipe section `data`: where the shards are, how they are read, and which views are made."""

from dataclasses import dataclass, field

from scale.config.fields import FIXED, NOTED, at_least, choice, listed_in, plain, within


@dataclass
class ViewsConfig:
    # multicrop (DINO/EsViT) | two_view (MoCo v3/BYOL/SimCLR) | supervised (DRLoc, fine-tuning) | eval
    kind: str = choice("multicrop", ["multicrop", "two_view", "supervised", "eval"])
    n_global: int = at_least(2, 1)
    global_size: int = at_least(224, 1)
    global_scale: list[float] = within([0.4, 1.0], 0.0, 1.0)
    # several local sizes are allowed (EsViT); n_local[i] crops of local_sizes[i] px
    local_sizes: list[int] = at_least([96], 1)
    n_local: list[int] = at_least([8], 0, resume=NOTED)  # more or fewer local crops: no checkpointed shape
    local_scale: list[float] = within([0.05, 0.4], 0.0, 1.0)
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    interpolation: str = choice(
        "bicubic", listed_in("scale.data.views", "INTERPOLATION", ("bicubic", "bilinear"))
    )  # bicubic, bilinear
    flip_p: float = within(0.5, 0.0, 1.0)
    color_jitter: list[float] = field(default_factory=lambda: [0.4, 0.4, 0.2, 0.1])
    color_jitter_p: float = within(0.8, 0.0, 1.0)
    grayscale_p: float = within(0.2, 0.0, 1.0)
    # per global view (view 1, view 2); locals use local_blur_p / local_solarize_p
    blur_p: list[float] = within([1.0, 0.1], 0.0, 1.0)
    solarize_p: list[float] = within([0.0, 0.2], 0.0, 1.0)
    local_blur_p: float = within(0.5, 0.0, 1.0)
    local_solarize_p: float = within(0.0, 0.0, 1.0)
    blur_sigma: list[float] = field(default_factory=lambda: [0.1, 2.0])
    # multicrop, two_view: flip, jitter, greyscale, blur, solarize in the CPU workers (cpu) or batched on the device
    # (device: the workers ship uint8 crops); auto: device when the batches go to a CUDA device (data.backend=dali
    # has its own path)
    photometric_on: str = choice("auto", listed_in("scale.data.photometric", "PLACES", ("auto", "cpu", "device")))
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    # supervised views (timm transform factory)
    auto_augment: str = "rand-m9-mstd0.5-inc1"
    random_erase_p: float = within(0.25, 0.0, 1.0)
    # evaluation views
    eval_resize: int = at_least(256, 1)
    eval_crop: int = at_least(224, 1)


@dataclass
class DataConfig:
    # a shard directory with an _info.json manifest; ${oc.env:SCALE_DATA,data} lets a cluster point elsewhere
    train: str = plain("${oc.env:SCALE_DATA,data}/imagenet1k/train", NOTED)  # moved shards; the position is kept
    val: str = "${oc.env:SCALE_DATA,data}/imagenet1k/val"
    # torchvision | dali (the extra `dali`; multicrop and two_view views)
    backend: str = choice("torchvision", listed_in("scale.data.factory", "BACKENDS", ("torchvision", "dali")))
    dali_device: str = choice("auto", ["auto", "gpu", "cpu"])  # auto: the GPU when CUDA is available
    # epochs: every sample once per epoch | resampled: an infinite stream
    mode: str = choice("epochs", listed_in("scale.data.loader", "MODES", ("epochs", "resampled")))
    workers: int = at_least(4, 0)
    # CUDA: pinned batches, the next one copied to the GPU on a side stream during the step (scale/data/prefetch.py)
    prefetch_to_device: bool = True
    shuffle_buffer: int = at_least(2000, 0)
    error_budget: float = within(0.001, 0.0, 1.0)  # fraction of samples that may be bad before the run stops
    num_classes: int = at_least(1000, 1, resume=FIXED)  # the class heads' width
    views: ViewsConfig = field(default_factory=ViewsConfig)

"""Recipe section `data`: where the shards are, how they are read, and which views are made."""

from dataclasses import dataclass, field

from scale.config.fields import FIXED, NOTED, at_least, choice, listed_in, plain, within


@dataclass
class ViewsConfig:
    # multicrop (DINO/EsViT) | two_view (MoCo v3/BYOL/SimCLR) | supervised (DRLoc, fine-tuning) | eval
    kind: str = choice("multicrop", ["multicrop", "two_view", "supervised", "eval"])
    # global crops per image
    n_global: int = at_least(2, 1)
    # side of a global crop in px
    global_size: int = at_least(224, 1)
    # area range of a global crop, as a fraction of the image (RandomResizedCrop's scale)
    global_scale: list[float] = within([0.4, 1.0], 0.0, 1.0)
    # several local sizes are allowed (EsViT); n_local[i] crops of local_sizes[i] px
    local_sizes: list[int] = at_least([96], 1)
    # local crops of each size of local_sizes
    n_local: list[int] = at_least([8], 0, resume=NOTED)  # more or fewer local crops: no checkpointed shape
    # area range of a local crop, as a fraction of the image (RandomResizedCrop's scale)
    local_scale: list[float] = within([0.05, 0.4], 0.0, 1.0)
    # aspect-ratio range of the random resized crops
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    interpolation: str = choice(
        "bicubic", listed_in("scale.data.views", "INTERPOLATION", ("bicubic", "bilinear"))
    )  # bicubic, bilinear
    # probability of a horizontal flip
    flip_p: float = within(0.5, 0.0, 1.0)
    # brightness, contrast, saturation and hue of the colour jitter
    color_jitter: list[float] = field(default_factory=lambda: [0.4, 0.4, 0.2, 0.1])
    # probability that a crop is colour-jittered
    color_jitter_p: float = within(0.8, 0.0, 1.0)
    # probability that a crop is made grey-scale
    grayscale_p: float = within(0.2, 0.0, 1.0)
    # Gaussian blur probability per global view (view 1, view 2); locals use local_blur_p / local_solarize_p
    blur_p: list[float] = within([1.0, 0.1], 0.0, 1.0)
    # solarization probability per global view (view 1, view 2)
    solarize_p: list[float] = within([0.0, 0.2], 0.0, 1.0)
    # Gaussian blur probability of the local crops
    local_blur_p: float = within(0.5, 0.0, 1.0)
    # solarization probability of the local crops
    local_solarize_p: float = within(0.0, 0.0, 1.0)
    # range of the Gaussian blur's sigma
    blur_sigma: list[float] = field(default_factory=lambda: [0.1, 2.0])
    # multicrop, two_view: flip, jitter, greyscale, blur, solarize in the CPU workers (cpu) or batched on the device
    # (device: the workers ship uint8 crops); auto: device when the batches go to a CUDA device (data.backend=dali
    # has its own path)
    photometric_on: str = choice("auto", listed_in("scale.data.photometric", "PLACES", ("auto", "cpu", "device")))
    # per-channel mean of the normalisation
    mean: list[float] = field(default_factory=lambda: [0.485, 0.456, 0.406])
    # per-channel standard deviation of the normalisation
    std: list[float] = field(default_factory=lambda: [0.229, 0.224, 0.225])
    # supervised views (timm transform factory): the RandAugment policy
    auto_augment: str = "rand-m9-mstd0.5-inc1"
    # supervised views: probability of random erasing
    random_erase_p: float = within(0.25, 0.0, 1.0)
    # evaluation views: the short side is resized to this before the center crop
    eval_resize: int = at_least(256, 1)
    # evaluation views: side of the center crop in px, after the short side is resized to eval_resize
    eval_crop: int = at_least(224, 1)
    # evaluation views: the resize's interpolation: bicubic (DINO eval_linear.py, DeiT datasets.py) or bilinear
    # (MoCo v3 main_lincls.py, transfer/datasets.py: torchvision's default)
    eval_interpolation: str = choice("bicubic", listed_in("scale.data.views", "INTERPOLATION", ("bicubic", "bilinear")))


@dataclass
class DataConfig:
    # a shard directory with an _info.json manifest; ${oc.env:SCALE_DATA,data} lets a cluster point elsewhere
    train: str = plain("${oc.env:SCALE_DATA,data}/imagenet1k/train", NOTED)  # moved shards; the position is kept
    # the validation split's shard directory (evaluations, k-NN monitor, in-training validation)
    val: str = "${oc.env:SCALE_DATA,data}/imagenet1k/val"
    # torchvision | dali (the extra `dali`; multicrop and two_view views)
    backend: str = choice("torchvision", listed_in("scale.data.factory", "BACKENDS", ("torchvision", "dali")))
    dali_device: str = choice("auto", ["auto", "gpu", "cpu"])  # auto: the GPU when CUDA is available
    # epochs: every sample once per epoch | resampled: an infinite stream
    mode: str = choice("epochs", listed_in("scale.data.loader", "MODES", ("epochs", "resampled")))
    # loader worker processes per rank (capped at the CPUs the rank may run on)
    workers: int = at_least(4, 0)
    # CUDA: pinned batches, the next one copied to the GPU on a side stream during the step (scale/data/prefetch.py)
    prefetch_to_device: bool = True
    # samples in each window that the loader permutes (the order stays fixed by seed and epoch)
    shuffle_buffer: int = at_least(2000, 0)
    # repeated augmentation (DeiT samplers.py RASampler, on in DeiT main.py by default): each image of the epoch
    # order k times, the copies in one global batch on different ranks (scale/data/loader.py RepeatedOrder); 1: off.
    # Changing it on resume changes the rest of the epoch's order (the resumed run logs it)
    repeated_aug: int = at_least(1, 1, resume=NOTED)
    error_budget: float = within(0.001, 0.0, 1.0)  # fraction of samples that may be bad before the run stops
    num_classes: int = at_least(1000, 1, resume=FIXED)  # the class heads' width
    views: ViewsConfig = field(default_factory=ViewsConfig)

"""The DALI graph of the multi-crop views (scale/data/views.py CropViews), one pipeline per rank.

Each image is decoded once (`mixed`: nvJPEG on the GPU; `cpu` in CPU mode) and branches into one chain per view,
with the parameters of the torchvision views: a crop window drawn like RandomResizedCrop (area fraction uniform in
the view's scale, aspect ratio log-uniform in `ratio`, 10 attempts, then a central crop) and resized with
antialiasing; then, each with its own per-sample coin: colour jitter (p color_jitter_p; brightness, contrast,
saturation and hue factors drawn like torchvision's ColorJitter and applied in a random order per sample),
greyscale, Gaussian blur (sigma uniform in blur_sigma, p per view), solarize (threshold 128, p per view); finally
flip and normalisation in one op (both commute with the colour ops and the symmetric blur). Crops stay uint8 between
ops, as with PIL.

Where DALI differs from the torchvision ops (by design, small): the hue shift is DALI's rotation in YIQ space
(torchvision: PIL's uint8 HSV), blur borders reflect (PIL: clamp), blend results are rounded (PIL truncates).

Random draws are DataNodes made outside the conditional branches, so every sample gets its own; with `expose=True`
the pipeline also returns them (the same nodes the ops consume), which the parity tests read.
"""

import itertools
from dataclasses import dataclass

import nvidia.dali.fn as fn
import nvidia.dali.math as dmath
import nvidia.dali.types as types
from nvidia.dali import pipeline_def

PERMUTATIONS = list(itertools.permutations(range(4)))  # the order of brightness, contrast, saturation, hue
PARAMS = ("shape", "anchor", "size", "flip", "jitter", "order", "gray", "blur", "sigma", "solarize")


@dataclass
class PipelineSpec:
    paths: list  # tar files (non-empty shards)
    index_paths: list  # their DALI indexes
    label_ext: str | None  # "cls", "labels" or None (unlabeled)
    views: object  # a CropViews
    mean: tuple
    std: tuple
    batch_size: int
    shard_id: int
    num_shards: int
    shuffle_buffer: int
    seed: int  # this rank's pipeline seed
    shard_order_seed: int  # the same on every rank: the reader's tar order per epoch
    device: str  # "cpu" | "gpu"
    device_id: int | None
    num_threads: int


def build_pipeline(spec: PipelineSpec, checkpoint: bytes | None = None, expose: bool = False):
    """A built pipeline; outputs: source info, label bytes (if labelled), one crop per view in the views' order
    (float32 [B, 3, S, S] normalised), then with expose the PARAMS of each view, view by view."""
    graph = pipeline_def(_graph, enable_conditionals=True)
    pipe = graph(
        spec=spec,
        expose=expose,
        batch_size=spec.batch_size,
        num_threads=spec.num_threads,
        device_id=spec.device_id,
        seed=spec.seed,
        enable_checkpointing=True,
        checkpoint=checkpoint,
        prefetch_queue_depth=2,
    )
    pipe.build()
    return pipe


def _graph(spec: PipelineSpec, expose: bool):
    ext = ["jpg"] + ([spec.label_ext] if spec.label_ext else [])
    read = fn.readers.webdataset(
        paths=spec.paths,
        index_paths=spec.index_paths,
        ext=ext,
        shard_id=spec.shard_id,
        num_shards=spec.num_shards,
        random_shuffle=True,
        initial_fill=max(1, spec.shuffle_buffer),
        shuffle_after_epoch=True,
        shuffle_after_epoch_seed=spec.shard_order_seed,
        missing_component_behavior="skip",
        name="reader",
    )
    jpegs = read[0] if spec.label_ext else read
    shape = fn.peek_image_shape(jpegs)
    image = fn.decoders.image(jpegs, device="mixed" if spec.device == "gpu" else "cpu", output_type=types.RGB)
    crops, params = [], []
    for group in spec.views.groups:
        for crop in group:
            out, drawn = _view(image, shape, crop, spec)
            crops.append(out)
            params += [drawn[name] for name in PARAMS]
    labels = [read[1]] if spec.label_ext else []
    return (fn.get_property(jpegs, key="source_info"), *labels, *crops, *(params if expose else []))


def _view(image, shape, crop, spec: PipelineSpec):
    views = spec.views
    anchor, size = fn.random_crop_generator(
        shape, random_area=list(crop.scale), random_aspect_ratio=list(views.ratio), num_attempts=10
    )
    interp = types.INTERP_CUBIC if views.interpolation == "bicubic" else types.INTERP_LINEAR
    x = fn.resize(
        image,
        roi_start=fn.cast(anchor, dtype=types.FLOAT),
        roi_end=fn.cast(anchor + size, dtype=types.FLOAT),
        roi_relative=False,
        size=[crop.size, crop.size],
        interp_type=interp,
        antialias=True,
    )
    b, c, s, h = views.jitter
    drawn = {
        "shape": shape,
        "anchor": anchor,
        "size": size,
        "flip": fn.random.coin_flip(probability=views.flip_p),
        "jitter": fn.random.coin_flip(probability=views.jitter_p),
        "order": fn.random.choice(len(PERMUTATIONS)),
        "gray": fn.random.coin_flip(probability=views.grayscale_p),
        "blur": fn.random.coin_flip(probability=crop.blur_p),
        "sigma": fn.random.uniform(range=list(views.blur_sigma)),
        "solarize": fn.random.coin_flip(probability=crop.solarize_p),
    }
    factors = (
        _uniform(max(0.0, 1 - b), 1 + b),
        _uniform(max(0.0, 1 - c), 1 + c),
        _uniform(max(0.0, 1 - s), 1 + s),
        _uniform(-h * 360.0, h * 360.0),
    )  # torchvision's hue factor is a fraction of the circle
    gpu = spec.device == "gpu"
    if drawn["jitter"]:
        x = _jitter(x, drawn["order"], factors, gpu)
    if drawn["gray"]:
        x = _grayscale(x)
    if drawn["blur"]:
        x = fn.gaussian_blur(x, sigma=drawn["sigma"])
    if drawn["solarize"]:
        x = _solarize(x)
    out = fn.crop_mirror_normalize(
        x,
        mirror=drawn["flip"],
        mean=[255.0 * m for m in spec.mean],
        std=[255.0 * v for v in spec.std],
        dtype=types.FLOAT,
        output_layout="CHW",
    )
    return out, drawn


def _uniform(low: float, high: float):
    """Per-sample U[low, high]; a constant when the range is empty (a jitter strength of 0)."""
    return fn.random.uniform(range=[low, high]) if high > low else low


def _jitter(x, order, factors, gpu: bool):
    """torchvision ColorJitter: the four ops in the sample's random order (stage k applies PERMUTATIONS[order][k])."""
    brightness, contrast, saturation, hue = factors
    for stage in range(4):
        op = fn.lookup_table(
            order, keys=list(range(len(PERMUTATIONS))), values=[p[stage] for p in PERMUTATIONS], dtype=types.INT32
        )
        if op == 0:
            x = fn.brightness(x, brightness=brightness)
        elif op == 1:
            x = _blend(x, fn.reductions.mean(_luma(x)), contrast, gpu)
        elif op == 2:
            x = _blend(x, _luma(x), saturation, gpu)
        else:
            x = fn.hue(x, hue=hue)
    return x


def _blend(x, degenerate, factor, gpu: bool):
    """PIL's ImageEnhance blend: degenerate + factor * (x - degenerate), clipped to uint8."""
    if gpu and not isinstance(factor, float):
        factor = factor.gpu()  # arithmetic takes its tensor inputs from one device
    x = fn.cast(x, dtype=types.FLOAT)  # uint8 arithmetic would wrap around
    return fn.cast(dmath.clamp((x - degenerate) * factor + degenerate, 0.0, 255.0), dtype=types.UINT8)


def _luma(x):
    """PIL's convert("L") weights (ITU-R 601), uint8 [H, W, 1]."""
    return fn.color_space_conversion(x, image_type=types.RGB, output_type=types.GRAY)


def _grayscale(x):
    luma = _luma(x)
    return fn.cat(luma, luma, luma, axis=2)


def _solarize(x):
    return fn.lookup_table(
        x, keys=list(range(256)), values=[v if v < 128 else 255 - v for v in range(256)], dtype=types.UINT8
    )

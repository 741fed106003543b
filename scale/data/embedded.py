"""Small real-image data sets made only from images that installed packages ship (nothing is downloaded).

- `digits`: scikit-learn's 1797 hand-written digits (8x8, 16 grey levels), upscaled bicubically to 32x32 RGB;
  10 classes (the digit). Every 5th image (by position) is in val: 1437 train / 360 val.
- `photos`: 12 classes, one per source photo (scikit-image's astronaut, chelsea, coffee, rocket, hubble_deep_field,
  retina, immunohistochemistry, motorcycle_left, camera, coins; scikit-learn's china and flower). Each sample is a
  random crop (3-60% of the photo's area, aspect 3/4..4/3) resized to 64x64; 100 train + 25 val crops per class,
  drawn with different seeds. k-NN on good features separates the photos; chance is 1/12.
- `photos_large`: the same 12 photos, 40 train + 10 val crops per class (30-100% of the area, aspect 4/3) resized
  to 500x375 JPEGs: ImageNet-like sizes for `scale bench data`.

Everything is deterministic: the same name gives byte-identical shards.
"""

import io
import random
from pathlib import Path

import numpy as np
from PIL import Image

from scale.data.shards.write import Item, Source, build_shards
from scale.errors import UserError
from scale.extras import require

PHOTOS = [
    "skimage:astronaut.png",
    "skimage:chelsea.png",
    "skimage:coffee.png",
    "skimage:rocket.jpg",
    "skimage:hubble_deep_field.jpg",
    "skimage:retina.jpg",
    "skimage:ihc.png",
    "skimage:motorcycle_left.png",
    "skimage:camera.png",
    "skimage:coins.png",
    "sklearn:china.jpg",
    "sklearn:flower.jpg",
]
NAMES = ("digits", "photos", "photos_large")
SHARD_SIZE = 256


def _jpeg(img: Image.Image, quality: int = 92) -> bytes:
    out = io.BytesIO()
    img.save(out, "JPEG", quality=quality)
    return out.getvalue()


def _package_photo(spec: str) -> Image.Image:
    package, name = spec.split(":")
    if package == "skimage":
        folder = Path(require("eval", "skimage.data", "the embedded photos").__file__).parent
    else:
        folder = Path(require("eval", "sklearn.datasets", "the embedded photos").__file__).parent / "images"
    path = folder / name
    if not path.is_file():
        raise UserError(f"embedded photo not shipped by the installed {package}: {path}")
    return Image.open(path).convert("RGB")


def _digits(split: str) -> Source:
    digits = require("eval", "sklearn.datasets", "the embedded digits").load_digits()
    items = []
    for i, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        if (i % 5 == 0) != (split == "val"):
            continue
        grey = Image.fromarray(np.uint8(np.round(pixels * 255 / 16)), "L").resize((32, 32), Image.BICUBIC)
        items.append(Item(f"sklearn:digits[{i}]", int(label), _jpeg(grey.convert("RGB"))))
    return Source(f"embedded:digits/{split}", "single", [str(d) for d in range(10)], items)


def _random_crop(rng: random.Random, width: int, height: int, scale, aspect) -> tuple:
    while True:
        area = width * height * rng.uniform(*scale)
        ratio = aspect if isinstance(aspect, float) else np.exp(rng.uniform(np.log(aspect[0]), np.log(aspect[1])))
        w, h = round((area * ratio) ** 0.5), round((area / ratio) ** 0.5)
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            return x, y, x + w, y + h


def _photos(split: str, per_class: dict, size: tuple, scale, aspect, name: str) -> Source:
    count = per_class[split]
    items = []
    for label, spec in enumerate(PHOTOS):
        photo = _package_photo(spec)
        rng = random.Random(f"{name}/{split}/{spec}")
        for n in range(count):
            box = _random_crop(rng, photo.width, photo.height, scale, aspect)
            crop = photo.resize(size, Image.BICUBIC, box=box, reducing_gap=3.0)
            items.append(Item(f"{spec}#{split}{n}", label, _jpeg(crop)))
    return Source(f"embedded:{name}/{split}", "single", [s.split(":")[1].split(".")[0] for s in PHOTOS], items)


def source(name: str, split: str) -> Source:
    if name == "digits":
        return _digits(split)
    if name == "photos":
        return _photos(split, {"train": 100, "val": 25}, (64, 64), (0.03, 0.6), (3 / 4, 4 / 3), name)
    if name == "photos_large":
        return _photos(split, {"train": 40, "val": 10}, (500, 375), (0.3, 1.0), 4 / 3, name)
    raise UserError(f"unknown embedded data set '{name}' (choose from {', '.join(NAMES)})")


def build(name: str, out_dir, progress: bool = False) -> dict:
    """Build embedded data set `name` as shards and return {"train": Path, "val": Path}.

    Layout: out_dir/train and out_dir/val are shard directories (`_info.json` manifest, `shard-NNNNNN.tar` of at
    most 256 samples each, `shard-NNNNNN.idx`, `_skipped.tsv`), readable by `scale.data.factory.build_loader` by
    pointing `data.train` / `data.val` at them. A rerun on a complete directory only checks it.
    """
    out_dir = Path(out_dir)
    dirs = {}
    for split in ("train", "val"):
        dirs[split] = out_dir / split
        build_shards(source(name, split), dirs[split], shard_size=SHARD_SIZE, progress=progress)
    return dirs

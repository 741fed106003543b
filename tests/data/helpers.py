"""Small shard directories for the data tests."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from PIL import Image

from scale.data.config import DataConfig


def jpeg(seed: int, size=(24, 20)) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def write_tar(path: Path, samples: list) -> None:
    """samples: [(key, {ext: bytes})], written with plain tarfile and no .idx (like shards from other tools)."""
    with tarfile.open(path, "w") as tar:
        for key, members in samples:
            for ext, payload in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))


def write_manifest(shard_dir: Path, counts: dict, classes=("a", "b")) -> None:
    shards = [{"name": name, "count": n} for name, n in counts.items()]
    (shard_dir / "_info.json").write_text(
        json.dumps(
            {"label_kind": "single", "classes": list(classes), "num_samples": sum(counts.values()), "shards": shards}
        )
    )


def good_shards(shard_dir: Path, counts: list, start_key: int = 0) -> None:
    """Hand-written shards of `counts` good samples each, with a manifest."""
    shard_dir.mkdir(parents=True, exist_ok=True)
    names, key = {}, start_key
    for n, count in enumerate(counts):
        samples = []
        for _ in range(count):
            samples.append((f"{key:06d}", {"jpg": jpeg(key), "cls": str(key % 2).encode()}))
            key += 1
        write_tar(shard_dir / f"s{n}.tar", samples)
        names[f"s{n}.tar"] = count
    write_manifest(shard_dir, names)


def tiny_cfg(train: Path, **overrides):
    cfg = OmegaConf.structured(DataConfig(train=str(train), val=str(train), workers=0, shuffle_buffer=16))
    cfg.views.global_size, cfg.views.local_sizes, cfg.views.n_local = 16, [8], [2]
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def make_imagefolder(root: Path, per_class: int = 3) -> Path:
    """An imagefolder source: classes cat and dog, `per_class` JPEGs each, a PNG, and a file that is no image."""
    for c, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(jpeg(10 * c + i, size=(80, 40)))
    Image.new("RGB", (30, 30), "red").save(root / "dog" / "z.png")
    (root / "cat" / "broken.jpg").write_bytes(b"not a jpeg at all")
    return root

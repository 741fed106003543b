"""The supervised view (timm RandAugment inc1 + random erasing) runs on every image and leaves the training
process's random streams alone."""

import io
import random

import torch
from omegaconf import OmegaConf
from PIL import Image

from scale.data.config import ViewsConfig
from scale.data.views import build_views


def _jpeg(seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (48, 40, 3), generator=gen, dtype=torch.uint8).numpy()
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def test_randaugment_inc1_at_high_magnitude_never_fails():
    # magnitude 10 asks for a 0-bit posterize, which Pillow 13 rejects (hence pillow<13 in setup.cfg)
    cfg = OmegaConf.structured(ViewsConfig(kind="supervised", global_size=32, auto_augment="rand-n3-m10-mstd1.0-inc1"))
    views = build_views(cfg)
    rng = random.Random(0)
    for i in range(60):
        crops = views(_jpeg(i), rng)
        assert crops[0][0].shape == (3, 32, 32)


def test_supervised_view_does_not_touch_global_rngs():
    cfg = OmegaConf.structured(ViewsConfig(kind="supervised", global_size=32))
    views = build_views(cfg)
    random.seed(123)
    torch.manual_seed(123)
    expected = (random.random(), torch.rand(1).item())
    random.seed(123)
    torch.manual_seed(123)
    views(_jpeg(0), random.Random(5))
    assert (random.random(), torch.rand(1).item()) == expected

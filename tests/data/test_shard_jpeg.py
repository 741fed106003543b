"""scale/data/shards/jpeg.py: every image mode becomes the RGB a viewer shows (scaled, transparency on white)."""

import io

import pytest
from PIL import Image

from scale.data.shards.jpeg import prepare_jpeg


def _modes() -> dict:
    """Images of every troublesome mode whose correct RGB value is mid-grey (128) or white (255)."""
    import numpy as np

    palette = Image.new("P", (8, 8), 0)
    palette.putpalette([0, 0, 0] * 256)
    palette.info["transparency"] = 0  # every pixel transparent: white on the white background, not black
    return {
        "I;16": (Image.fromarray(np.full((8, 8), 32896, np.uint16), "I;16"), 128),
        "I": (Image.fromarray(np.full((8, 8), 32896, np.int32), "I"), 128),
        "F": (Image.fromarray(np.full((8, 8), 0.5, np.float32), "F"), 128),
        "P+transparency": (palette, 255),
        "LA": (Image.fromarray(np.zeros((8, 8, 2), np.uint8), "LA"), 255),
        "RGBA": (Image.fromarray(np.zeros((8, 8, 4), np.uint8), "RGBA"), 255),
        "CMYK": (Image.new("CMYK", (8, 8), (0, 0, 0, 127)), 128),
    }


@pytest.mark.parametrize("mode", sorted(_modes()))
def test_image_modes_are_scaled_to_rgb_not_clipped(mode):
    import numpy as np

    img, expected = _modes()[mode]
    buf = io.BytesIO()
    img.save(buf, "TIFF" if mode in ("F", "I", "CMYK") else "PNG")
    data, _, _ = prepare_jpeg(buf.getvalue(), None, 95)
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int32)
    assert np.abs(pixels - expected).max() <= 3, (mode, pixels[0, 0])

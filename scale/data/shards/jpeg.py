"""The JPEG bytes a shard stores for a source image (writer), and the check that stored bytes decode (verifier)."""

import io
import re

import numpy as np
from PIL import Image


class BadImage(Exception):
    """A source image that cannot be used; the message is the reason written to the skipped report."""


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB, scaled rather than clipped: 16-bit and 32-bit integer images by their range (convert("RGB")
    clips every value above 255 to white), float images from [0, 1] (else their own min..max); transparent pixels
    (RGBA, LA, PA, palette with transparency) composited on white instead of showing the colour stored beneath."""
    if img.mode.startswith("I;16") or img.mode == "I":
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or values.max() <= 65535 else values.max()
        return Image.fromarray(np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        values = np.nan_to_num(np.asarray(img, dtype=np.float64))
        low, high = (0.0, 1.0) if values.min() >= 0 and values.max() <= 1 else (values.min(), values.max())
        values = (values - low) / max(high - low, 1e-12) * 255.0 + 0.5
        return Image.fromarray(np.clip(values, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "P" and "transparency" in img.info or img.mode in ("PA", "LA", "La", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, img).convert("RGB")
    return img.convert("RGB")


def prepare_jpeg(data: bytes, max_side: int | None, quality: int) -> tuple[bytes, int, int]:
    """JPEG bytes to store: the original bytes when they are an RGB/L JPEG within max_side, else a re-encode.

    Raises BadImage when the bytes do not decode completely.
    """
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        too_big = bool(max_side) and max(width, height) > max_side
        if img.format == "JPEG" and img.mode in ("RGB", "L") and not too_big:
            img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))  # reads every coefficient, decodes 1/8
            img.load()
            return data, width, height
        img.load()
        img = to_rgb(img)
        if too_big:
            scale = max_side / max(width, height)
            img = img.resize(
                (max(1, round(width * scale)), max(1, round(height * scale))), Image.BICUBIC, reducing_gap=3.0
            )
        out = io.BytesIO()
        img.save(out, "JPEG", quality=quality)
        return out.getvalue(), img.width, img.height
    except BadImage:
        raise
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, DecompressionBombError)
        message = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(err))  # PIL names its BytesIO by address
        raise BadImage(f"{type(err).__name__}: {message}") from None

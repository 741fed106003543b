"""torchvision's PIL colour ops of the DINO augmentation, on uint8 [H, W, 3] arrays with OpenCV / numpy.

Each op repeats the arithmetic of the PIL call that torchvision makes: ImageEnhance's float32 blends truncated to
uint8, PIL's 16-bit fixed-point luma, PIL's uint8 HSV for the hue shift, PIL's box-blur kernel for GaussianBlur.
Working on arrays skips PIL's RGBX image copies between ops, and OpenCV's SIMD loops are 2-3x faster than PIL's on
the costly ones (hue, blur). How close each op is to PIL is tested in tests/data/test_fast_ops.py.
"""

import math

import cv2
import numpy as np

cv2.setNumThreads(1)  # loader workers are the parallelism; OpenCV's own threads would oversubscribe the cores

# PIL's L = (19595 R + 38470 G + 7471 B + 2^15) >> 16; OpenCV sums the dyadic weights exactly and rounds half to even,
# which differs from PIL's half up only on exact ties (136 of the 2^24 colours, by one level)
_LUMA = np.array([[19595, 38470, 7471, 0]], dtype=np.float32) / 65536
_LEVELS = np.arange(256, dtype=np.uint8)
_SOLARIZE = np.where(_LEVELS < 128, _LEVELS, 255 - _LEVELS).astype(np.uint8)


def luma(rgb: np.ndarray) -> np.ndarray:
    """PIL's convert("L"): uint8 [H, W]."""
    return cv2.transform(rgb, _LUMA)


def _blend(degenerate, rgb: np.ndarray, factor: float) -> np.ndarray:
    """PIL's Image.blend(degenerate, rgb, factor): degenerate + factor * (rgb - degenerate) in float32, clipped and
    truncated to uint8, with the operations in PIL's order so that the float rounding is the same."""
    out = rgb.astype(np.float32)
    out -= degenerate
    out *= np.float32(factor)
    out += degenerate
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def brightness(rgb: np.ndarray, factor: float) -> np.ndarray:
    """ImageEnhance.Brightness: blend with black, as a 256-entry table."""
    return cv2.LUT(rgb, _blend(np.float32(0), _LEVELS, factor))


def contrast(rgb: np.ndarray, factor: float) -> np.ndarray:
    """ImageEnhance.Contrast: blend with the mean luma rounded to an integer, as a 256-entry table."""
    mean = int(luma(rgb).mean() + 0.5)
    return cv2.LUT(rgb, _blend(np.float32(mean), _LEVELS, factor))


def saturation(rgb: np.ndarray, factor: float) -> np.ndarray:
    """ImageEnhance.Color: blend with the luma of each pixel (spread to three channels: numpy is slow on a
    broadcast axis of 3)."""
    return _blend(cv2.cvtColor(luma(rgb), cv2.COLOR_GRAY2RGB).astype(np.float32), rgb, factor)


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """torchvision rgb_to_grayscale(num_output_channels=3): the luma in all three channels."""
    return cv2.cvtColor(luma(rgb), cv2.COLOR_GRAY2RGB)


def solarize(rgb: np.ndarray) -> np.ndarray:
    """ImageOps.solarize(threshold=128): invert the levels >= 128."""
    return _SOLARIZE[rgb]


def shift_hue(rgb: np.ndarray, shift: int) -> np.ndarray:
    """torchvision's PIL hue adjustment of uint8 [H, W, 3]: RGB -> HSV with uint8 channels, hue += shift (mod 256),
    HSV -> RGB. OpenCV's float conversions with PIL's truncation of hue and saturation to uint8 replayed: 2-3x
    faster than PIL's conversions, and the same pixels up to float ties (a few per 10^3, by a few levels)."""
    hsv = cv2.cvtColor(rgb.astype(np.float32), cv2.COLOR_RGB2HSV)  # hue in degrees, saturation 0..1, value = max
    hue = (hsv[..., 0] * np.float32(255 / 360)).astype(np.uint8)  # PIL's uint8 hue: truncated, wraps at 256
    hue += np.uint8(shift)
    np.multiply(hue, np.float32(360 / 255), out=hsv[..., 0])
    sat = hsv[..., 1]
    sat *= 255
    np.floor(sat, out=sat)
    sat *= np.float32(1 / 255)
    out = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    return cv2.convertScaleAbs(out)  # rounds to nearest like PIL's round(); exact halves cannot occur here


def pil_blur_kernel(radius: float) -> np.ndarray:
    """The 1-D kernel of PIL's GaussianBlur(radius): three passes of an 'extended' box (a box of 2l+1 taps plus
    fractional end taps a) of variance radius^2 / 3 each, so that the total variance is radius^2 (Pillow's BoxBlur)."""
    var = radius * radius / 3
    taps = math.floor((math.sqrt(12 * var + 1) - 1) / 2)
    a = (2 * taps + 1) * (taps * (taps + 1) - 3 * var) / (6 * (var - (taps + 1) ** 2))
    box = np.array([a] + [1.0] * (2 * taps + 1) + [a]) / (2 * taps + 1 + 2 * a)
    return np.convolve(np.convolve(box, box), box)


def gaussian_blur(rgb: np.ndarray, radius: float) -> np.ndarray:
    """PIL's GaussianBlur(radius) on uint8 [H, W, 3] as one separable OpenCV filter with PIL's kernel (PIL rounds
    after each of its six box passes, this once): within ~0.5 grey levels on average, about 2x faster."""
    kernel = pil_blur_kernel(radius)
    return cv2.sepFilter2D(rgb, -1, kernel, kernel, borderType=cv2.BORDER_REFLECT)

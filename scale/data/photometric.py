"""The photometric half of the crop views, batched on the device (data.views.photometric_on=device).

The loader's CPU workers (scale/data/views.py) decode, crop and resize; they ship each crop as uint8 [3, H, W] and
its random parameters as one float32 row (`Draw.row`), drawn from the sample's generator exactly where the CPU
pipeline draws them: both modes see the same draws, and a resumed run the same augmentations. When the batch lands
on the device (`Batch.to`, scale/data/batch.py), `Photometric.apply` runs, per resolution group and on all its crops
at once: flip, colour jitter (its four ops in each crop's own order), greyscale, Gaussian blur, solarize, each as
torchvision's tensor op computes it (float in [0, 1], clamped after each op), then the normalisation.

A crop an op does not touch gets that op's neutral parameter (factor 1, a one-tap blur kernel), which leaves it
bit-identical, so no op needs a data-dependent branch and the host never waits for the device.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# the columns of a crop's parameter row
FLIP, JITTER, FACTORS, ORDER, GREY, SIGMA, SOLARIZE = 0, 1, 2, 6, 10, 11, 12
COLUMNS = 13
NEUTRAL_FACTORS = (1.0, 1.0, 1.0, 0.0)  # brightness, contrast, saturation, hue
LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale
SOLARIZE_THRESHOLD = 128 / 255  # PIL's ImageOps.solarize default, on [0, 1]


@dataclass
class Draw:
    """One crop's random parameters; `order`/`factors` None: no jitter, `sigma` None: no blur."""

    flip: bool
    order: list | None
    factors: list | None
    grey: bool
    sigma: float | None
    solarize: bool

    def row(self) -> list[float]:
        order = self.order if self.order is not None else [0, 1, 2, 3]
        factors = self.factors if self.factors is not None else NEUTRAL_FACTORS
        jitter, sigma = self.order is not None, self.sigma or 0.0
        return [self.flip, jitter, *factors, *order, self.grey, sigma, self.solarize]


PLACES = ("auto", "cpu", "device")  # data.views.photometric_on


def resolve(photometric_on: str, cuda: bool) -> str:
    """cpu or device: auto is the device for batches that go to a CUDA device, else the CPU (where the device ops
    would only add a pass over the batch)."""
    if photometric_on == "auto":
        return "device" if cuda else "cpu"
    return photometric_on


def blur_taps(max_sigma: float) -> int:
    """Kernel size for sigmas up to max_sigma: +-3 sigma, as torchvision's GaussianBlur is usually sized."""
    return 2 * math.ceil(3 * max_sigma) + 1


@dataclass
class Photometric:
    """Each group's parameter rows [N_g, COLUMNS] (view-major, as the crops), the normalisation [2, 3] (mean, std)
    and the blur kernel's taps. The tensors travel with the batch (pinned, copied without a wait): a tensor made
    from host numbers on the device would make the host wait for the stream."""

    params: list[torch.Tensor]
    norm: torch.Tensor
    taps: int

    @classmethod
    def of(cls, rows: list, mean, std, taps: int) -> "Photometric":
        """From each group's parameter rows (lists)."""
        params = [torch.tensor(r, dtype=torch.float32).view(-1, COLUMNS) for r in rows]
        return cls(params, torch.tensor([list(mean), list(std)], dtype=torch.float32), taps)

    def to(self, device: torch.device, non_blocking: bool = True) -> "Photometric":
        params = [p.to(device, non_blocking=non_blocking) for p in self.params]
        return Photometric(params, self.norm.to(device, non_blocking=non_blocking), self.taps)

    def pin_memory(self) -> "Photometric":
        return Photometric([p.pin_memory() for p in self.params], self.norm.pin_memory(), self.taps)

    def apply(self, crops: list[torch.Tensor]) -> list[torch.Tensor]:
        """uint8 groups [N, 3, H, W] -> augmented, normalised float groups, on the crops' device."""
        return [self._group(c, p) for c, p in zip(crops, self.params)]

    def _group(self, crops: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        x = crops.float().div_(255)
        x = torch.where(_rows(p[:, FLIP]), x.flip(-1), x)
        x = jitter(x, p[:, JITTER].bool(), p[:, FACTORS:ORDER], p[:, ORDER:GREY].long())
        x = torch.where(_rows(p[:, GREY]), grayscale(x).expand_as(x), x)
        x = gaussian_blur(x, p[:, SIGMA], self.taps)
        x = torch.where(_rows(p[:, SOLARIZE]) & (x >= SOLARIZE_THRESHOLD), 1.0 - x, x)
        return x.sub_(self.norm[0].view(1, 3, 1, 1)).div_(self.norm[1].view(1, 3, 1, 1))


def _rows(flags: torch.Tensor) -> torch.Tensor:
    return flags.bool().view(-1, 1, 1, 1)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    """[N, 3, H, W] -> [N, 1, H, W], torchvision's weights."""
    r, g, b = x.unbind(1)
    return (r * LUMA[0] + g * LUMA[1] + b * LUMA[2]).unsqueeze(1)


def blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's _blend with a per-crop factor [N]: factor * x + (1 - factor) * other, clamped to [0, 1]."""
    f = factor.view(-1, 1, 1, 1)
    return (f * x + (1.0 - f) * other).clamp_(0.0, 1.0)


def jitter(x: torch.Tensor, on: torch.Tensor, factors: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """ColorJitter with per-crop factors [N, 4] and op order [N, 4] (0 brightness, 1 contrast, 2 saturation, 3 hue):
    at each of the four positions, brightness, contrast and saturation are one blend towards black, the mean grey or
    the pixel's grey (whichever the crop's op there is; factor 1 for the others), then the hue shift."""
    for k in range(4):
        op = torch.where(on, order[:, k], -1)
        grey = grayscale(x)
        mean_grey = grey.mean(dim=(1, 2, 3), keepdim=True)
        target = torch.where(_rows(op == 1), mean_grey, torch.where(_rows(op == 2), grey, torch.zeros_like(grey)))
        factor = torch.ones_like(factors[:, 0])
        for j in range(3):
            factor = torch.where(op == j, factors[:, j], factor)
        x = blend(x, target, factor)
        x = torch.where(_rows(op == 3), shift_hue(x, factors[:, 3]), x)
    return x


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_hue with a per-crop shift [N] in [-0.5, 0.5]: through HSV, h = (h + shift) mod 1."""
    value, channel = x.max(dim=1)
    delta = value - x.min(dim=1).values
    saturation = delta / torch.where(value > 0, value, 1.0)
    r, g, b = x.unbind(1)
    d = torch.where(delta > 0, delta, 1.0)
    hue = torch.where(channel == 0, (g - b) / d, torch.where(channel == 1, 2.0 + (b - r) / d, 4.0 + (r - g) / d))
    hue = (hue / 6.0 + 1.0 + shift.view(-1, 1, 1)).remainder(1.0)
    # HSV -> RGB: channel n is v - v s clamp(min(k, 4 - k), 0, 1) with k = (n + 6 h) mod 6, n = 5, 3, 1
    n = torch.arange(5.0, 0.0, -2.0, device=x.device).view(1, 3, 1, 1)
    k = (n + 6.0 * hue.unsqueeze(1)).remainder(6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
    v, s = value.unsqueeze(1), saturation.unsqueeze(1)
    return (v - v * s * ramp).clamp_(0.0, 1.0)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, taps: int) -> torch.Tensor:
    """torchvision's gaussian_blur (reflect padding, kernel of `taps` taps) with a per-crop sigma [N]; sigma 0 is a
    one-tap kernel (the crop unchanged): one separable grouped convolution for all the crops."""
    n, c, h, w = x.shape
    half = taps // 2
    grid = torch.linspace(-half, half, taps, device=x.device)
    pdf = torch.exp(-0.5 * (grid / sigma.clamp(min=1e-6).view(-1, 1)) ** 2)
    kernel = (pdf / pdf.sum(dim=1, keepdim=True)).repeat_interleave(c, dim=0)  # [N * 3, taps]
    planes = F.pad(x.reshape(1, n * c, h, w), (half, half, half, half), mode="reflect")
    planes = F.conv2d(planes, kernel.view(n * c, 1, 1, taps), groups=n * c)
    planes = F.conv2d(planes, kernel.view(n * c, 1, taps, 1), groups=n * c)
    return planes.view(n, c, h, w)

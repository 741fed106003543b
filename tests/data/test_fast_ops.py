"""The fast crop ops (scale.data.views, scale.data.colour) against the PIL / torchvision ops of the official DINO
augmentation, and the crops of both pipelines."""

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps
from skimage import data as photos
from torchvision.transforms import functional as TF

from scale.data import colour
from scale.data.colour import gaussian_blur, pil_blur_kernel, shift_hue, solarize
from scale.data.reference import ReferenceDino
from scale.data.views import INTERPOLATION, build_views, random_resized_crop_box, resize_crop
from tests.data.test_embedded_views import cfg


def photo_crops(size: int, n: int = 6):
    """Real photos (shipped with scikit-image), resized crops of size x size."""
    rng = random.Random(0)
    crops = []
    for name in ("astronaut", "chelsea", "coffee"):
        img = Image.fromarray(getattr(photos, name)())
        for _ in range(n // 3):
            box = random_resized_crop_box(rng, img.width, img.height, (0.05, 1.0), (3 / 4, 4 / 3))
            crops.append(img.resize((size, size), Image.BICUBIC, box=box))
    return crops


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_resize_crop_matches_pil_resize_of_the_box(mode):
    rng = random.Random(1)
    img = Image.fromarray(photos.astronaut())
    pixels = torch.from_numpy(np.array(img)).permute(2, 0, 1)
    for size, scale in [(224, (0.4, 1.0)), (96, (0.05, 0.4))] * 3:
        box = random_resized_crop_box(rng, img.width, img.height, scale, (3 / 4, 4 / 3))
        ours = resize_crop(pixels, box, size, mode).permute(1, 2, 0).numpy().astype(int)
        pil = np.asarray(img.resize((size, size), INTERPOLATION[mode], box=box)).astype(int)
        diff = np.abs(ours - pil)
        assert ours.shape == (size, size, 3)
        assert diff.mean() < 0.1
        # PIL's filter also reads pixels just outside the box, torch's stops at its edge: a few border pixels differ
        assert diff[3:-3, 3:-3].max() <= 1


@pytest.mark.parametrize(
    "op, tv_op",
    [
        (colour.brightness, TF.adjust_brightness),
        (colour.contrast, TF.adjust_contrast),
        (colour.saturation, TF.adjust_saturation),
    ],
)
def test_enhance_ops_equal_torchvision_pil_ops(op, tv_op):
    for crop in photo_crops(96):
        for factor in (0.6, 0.93, 1.0, 1.27, 1.4):
            assert np.array_equal(op(np.asarray(crop), factor), np.asarray(tv_op(crop, factor)))


def test_grayscale_equals_torchvision_and_luma_equals_pil_up_to_ties():
    for crop in photo_crops(96):
        assert np.array_equal(colour.grayscale(np.asarray(crop)), np.asarray(TF.rgb_to_grayscale(crop, 3)))
    levels = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    diff = np.abs(colour.luma(levels).astype(int) - np.asarray(Image.fromarray(levels).convert("L")))
    assert diff.max() <= 1 and diff.sum() <= 5  # rounding ties: 136 of the 2^24 colours


@pytest.mark.parametrize("factor", [-0.1, -0.037, 0.0, 0.02, 0.0999])
def test_shift_hue_matches_torchvision_adjust_hue(factor):
    for crop in photo_crops(96):
        ours = shift_hue(np.asarray(crop), int(factor * 255) % 256).astype(int)
        tv = np.asarray(TF.adjust_hue(crop, factor)).astype(int)
        diff = np.abs(ours - tv)
        assert (diff > 0).mean() < 0.01 and diff.mean() < 0.03 and diff.max() <= 8
        if factor:
            assert np.abs(ours - np.asarray(crop)).mean() > 1  # the shift really happened


def test_gaussian_blur_matches_pil_within_a_grey_level():
    for crop in photo_crops(96):
        rgb = np.asarray(crop)
        for radius in (0.1, 0.4, 1.0, 2.0):
            ours = gaussian_blur(rgb, radius).astype(int)
            pil = np.asarray(crop.filter(ImageFilter.GaussianBlur(radius))).astype(int)
            diff = np.abs(ours - pil)
            assert diff.mean() < 0.8 and diff[4:-4, 4:-4].max() <= 3 and abs((ours - pil).mean()) < 0.6
            if radius >= 1:  # a real blur, the same amount of it
                change = np.abs(pil - rgb).mean()
                assert change > 3 and np.abs(np.abs(ours - rgb).mean() - change) < 0.1 * change


def test_blur_kernel_is_normalised_with_the_requested_variance():
    for radius in (0.1, 0.5, 1.3, 2.0):
        kernel = pil_blur_kernel(radius)
        offsets = np.arange(len(kernel)) - len(kernel) // 2
        assert kernel.sum() == pytest.approx(1) and (kernel * offsets**2).sum() == pytest.approx(radius**2)


def test_solarize_is_pil_solarize():
    crop = photo_crops(32, 3)[0]
    assert np.array_equal(solarize(np.asarray(crop)), np.asarray(ImageOps.solarize(crop, 128)))


def crop_statistics(crops) -> np.ndarray:
    """Per crop (uint8 [3, H, W]): mean level, spread of levels, colourfulness (mean of max - min over channels), grey."""
    rows = []
    for crop in crops:
        x = crop.float()
        colour = (x.amax(0) - x.amin(0)).mean().item()
        rows.append([x.mean().item(), x.std().item(), colour, float(colour < 0.5)])
    return np.array(rows)


def test_views_have_the_crop_statistics_of_the_official_pipeline():
    """Ours and ReferenceDino (torchvision + PIL, as the official code) on the same photo: same distribution of crops."""
    buf = io.BytesIO()
    Image.fromarray(photos.chelsea()).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    views, rng = build_views(cfg(global_size=64, local_sizes=[32], n_local=[4])), random.Random(0)
    random.seed(0)
    torch.manual_seed(0)
    reference = ReferenceDino(global_size=64, local_size=32, n_local=4)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    ours, ref = [], []
    for _ in range(150):
        ours += [c for group in views(data, rng) for c in group]
        ref += [((c * std + mean) * 255).round().clamp(0, 255) for c in reference(data)]
    a, b = crop_statistics(ours), crop_statistics(ref)
    assert np.abs(a.mean(0) - b.mean(0)).tolist() == pytest.approx([0, 0, 0, 0], abs=3)  # levels; grey rate: 3%
    assert abs(a[:, 3].mean() - b[:, 3].mean()) < 0.04 and 0.1 < a[:, 3].mean() < 0.3
    assert np.abs(a.std(0) - b.std(0))[:3].max() < 3

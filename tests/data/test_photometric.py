"""data.views.photometric_on=device: the device ops (scale/data/photometric.py) against torchvision's functional
ops on fixed parameters, the distribution of the parameters the CPU side draws against the official DINO and MoCo v3
augmentations, and the split pipeline's batches (layout, closeness to the CPU pipeline, resume)."""

import random

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as photos
from torchvision.transforms.v2 import functional as F2

from scale.data.loader import Loader
from scale.data.photometric import COLUMNS, NEUTRAL_FACTORS, Draw, Photometric, blur_taps, resolve
from scale.data.spec import LoaderSpec
from scale.data.views import build_views
from tests.data.helpers import good_shards, jpeg, tiny_cfg
from tests.data.test_embedded_views import cfg as views_cfg

# float pixels in [0, 1]: torchvision computes the same formulas; only float rounding and (for the hue) another
# closed form of HSV -> RGB differ
TOLERANCE = 2e-5
MEAN, STD = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # no normalisation: apply's output is the augmented pixels
TAPS = blur_taps(2.0)


def photo_batch(size: int = 48) -> torch.Tensor:
    """Three real photos resized to size x size: uint8 [3, 3, size, size]."""
    out = [
        np.asarray(Image.fromarray(getattr(photos, n)()).resize((size, size)))
        for n in ("astronaut", "chelsea", "coffee")
    ]
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()


def apply(crops: torch.Tensor, draws: list[Draw]) -> torch.Tensor:
    return Photometric.of([[d.row() for d in draws]], MEAN, STD, TAPS).apply([crops])[0]


def draw(flip=False, order=None, factors=None, grey=False, sigma=None, solarize=False) -> Draw:
    return Draw(flip, order, factors, grey, sigma, solarize)


def one_jitter_op(op: int, factor: float) -> Draw:
    factors = list(NEUTRAL_FACTORS)
    factors[op] = factor
    return draw(order=[op, *[o for o in range(4) if o != op]], factors=factors)


TV_JITTER = [F2.adjust_brightness, F2.adjust_contrast, F2.adjust_saturation, F2.adjust_hue]


@pytest.mark.parametrize(
    "op, factors", [(0, (0.6, 1.0, 1.4)), (1, (0.6, 1.2, 1.4)), (2, (0.8, 1.2)), (3, (-0.1, 0.03, 0.1))]
)
def test_each_jitter_op_equals_torchvision(op, factors):
    crops = photo_batch()
    x = crops.float() / 255
    for factor in factors:
        ours = apply(crops, [one_jitter_op(op, factor)] * len(crops))
        theirs = torch.stack([TV_JITTER[op](img, factor) for img in x])
        assert (ours - theirs).abs().max() < TOLERANCE, (op, factor)


def test_flip_grey_blur_solarize_equal_torchvision():
    crops = photo_batch()
    x = crops.float() / 255
    cases = [
        (draw(flip=True), lambda img: F2.horizontal_flip(img)),
        (draw(grey=True), lambda img: F2.rgb_to_grayscale(img, num_output_channels=3)),
        (draw(solarize=True), lambda img: F2.solarize(img, 128 / 255)),
    ] + [(draw(sigma=s), lambda img, s=s: F2.gaussian_blur(img, [TAPS, TAPS], [s, s])) for s in (0.1, 0.7, 2.0)]
    for d, tv in cases:
        ours = apply(crops, [d] * len(crops))
        theirs = torch.stack([tv(img) for img in x])
        assert (ours - theirs).abs().max() < TOLERANCE, d


def test_every_op_in_each_crops_order_equals_torchvision_in_that_order():
    crops = photo_batch()
    rng = random.Random(3)
    draws = []
    for _ in range(len(crops)):
        order = [0, 1, 2, 3]
        rng.shuffle(order)
        factors = [rng.uniform(0.6, 1.4), rng.uniform(0.6, 1.4), rng.uniform(0.8, 1.2), rng.uniform(-0.1, 0.1)]
        draws.append(draw(True, order, factors, rng.random() < 0.5, rng.uniform(0.1, 2.0), True))
    ours = apply(crops, draws)
    for img, d, out in zip(crops.float() / 255, draws, ours):
        img = F2.horizontal_flip(img)
        for op in d.order:
            img = TV_JITTER[op](img, d.factors[op])
        if d.grey:
            img = F2.rgb_to_grayscale(img, num_output_channels=3)
        img = F2.solarize(F2.gaussian_blur(img, [TAPS, TAPS], [d.sigma, d.sigma]), 128 / 255)
        assert (out - img).abs().max() < TOLERANCE


def test_untouched_crops_are_the_normalised_input_bit_for_bit():
    crops = photo_batch()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = Photometric.of([[draw().row()] * len(crops)], mean, std, TAPS).apply([crops])[0]
    expected = (crops.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.allclose(out, expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- distributions

# the official augmentations (/work/shared/notes/official_code_facts.md 1.4 and 2.4): per view position, the
# probabilities of flip, jitter, grey-scale, blur and solarize
DINO = {"global1": (0.5, 0.8, 0.2, 1.0, 0.0), "global2": (0.5, 0.8, 0.2, 0.1, 0.2), "local": (0.5, 0.8, 0.2, 0.5, 0.0)}
MOCO = {"global1": (0.5, 0.8, 0.2, 1.0, 0.0), "global2": (0.5, 0.8, 0.2, 0.1, 0.2)}
JITTER_RANGES = [(0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1)]  # ColorJitter(0.4, 0.4, 0.2, 0.1)
SIGMA_RANGE = (0.1, 2.0)


def drawn_rows(kind: str, images: int) -> dict[str, torch.Tensor]:
    """The parameter rows that the split pipeline's CPU side ships, per view position, over `images` images."""
    if kind == "multicrop":
        c = views_cfg(global_size=32, local_sizes=[16], n_local=[10])
    else:
        c = views_cfg(kind="two_view", global_size=32, interpolation="bilinear", solarize_p=[0.0, 0.2])
    views = build_views(c, "device")
    data = jpeg(0, size=(80, 60))
    rows = {"global1": [], "global2": [], "local": []}
    for i in range(images):
        groups = views(data, random.Random(f"0/0/{i}"))
        rows["global1"].append(groups[0][0][1])
        rows["global2"].append(groups[0][1][1])
        rows["local"] += [row for _, row in (groups[1] if len(groups) > 1 else [])]
    return {k: torch.tensor(v) for k, v in rows.items() if v}


def assert_rate(flags: torch.Tensor, p: float, what: str) -> None:
    """The observed rate within 4.5 standard deviations of the binomial (exact for p 0 and 1)."""
    n, rate = len(flags), flags.float().mean().item()
    assert abs(rate - p) <= 4.5 * (p * (1 - p) / n) ** 0.5 + 1e-9, f"{what}: {rate:.3f} vs {p}"


@pytest.mark.parametrize("kind, official", [("multicrop", DINO), ("two_view", MOCO)])
def test_drawn_parameters_follow_the_official_augmentation(kind, official):
    rows = drawn_rows(kind, 1500)
    assert rows.keys() == official.keys()
    for position, probs in official.items():
        r = rows[position]
        assert r.shape[1] == COLUMNS and len(r) >= 1500
        for column, p, name in zip((0, 1, 10), probs[:3], ("flip", "jitter", "grey")):
            assert_rate(r[:, column] > 0, p, f"{position} {name}")
        assert_rate(r[:, 11] > 0, probs[3], f"{position} blur")
        assert_rate(r[:, 12] > 0, probs[4], f"{position} solarize")
        jittered = r[r[:, 1] > 0]
        for j, (low, high) in enumerate(JITTER_RANGES):  # uniform over the range: its bounds, mean and spread
            f = jittered[:, 2 + j]
            assert low <= f.min() and f.max() <= high
            assert f.min() < low + 0.05 * (high - low) and f.max() > high - 0.05 * (high - low)
            assert abs(f.mean() - (low + high) / 2) < 0.03 * (high - low)
        first = jittered[:, 6].long()  # a uniform random order: each op first a quarter of the time
        for op in range(4):
            assert_rate(first == op, 0.25, f"{position} op {op} first")
        assert torch.equal(torch.sort(jittered[:, 6:10], dim=1).values, torch.arange(4.0).expand(len(jittered), 4))
        sigma = r[r[:, 11] > 0][:, 11]
        if len(sigma) > 100:
            assert SIGMA_RANGE[0] <= sigma.min() and sigma.max() <= SIGMA_RANGE[1]
            assert abs(sigma.mean() - sum(SIGMA_RANGE) / 2) < 0.1


def test_device_effects_happen_at_the_official_rates():
    """The effects themselves, on the device side: grey crops (equal channels) about grayscale_p, solarized pixels
    (a bright crop comes out dark) at solarize_p on global view 2, never on view 1."""
    rows = drawn_rows("multicrop", 300)
    white = torch.full((1, 3, 8, 8), 250, dtype=torch.uint8)
    for position, probs in DINO.items():
        r = rows[position]
        photometric = Photometric.of([r.tolist()], MEAN, STD, TAPS)
        out = photometric.apply([white.expand(len(r), 3, 8, 8).clone()])[0]
        colourful = torch.tensor([[[[250]], [[40]], [[120]]]], dtype=torch.uint8).expand(len(r), 3, 8, 8).clone()
        grey = photometric.apply([colourful])[0]
        greyed = (grey.amax(1) - grey.amin(1)).amax(dim=(1, 2)) < 1e-6
        assert_rate(greyed, probs[2], f"{position} grey")
        solarized = out.mean(dim=(1, 2, 3)) < 0.5  # jitter keeps a 250 crop above 128 only mostly: the flag decides
        assert torch.equal(solarized, r[:, 12] > 0) or probs[4] == 0 and not solarized.any()


# ---------------------------------------------------------------------------------------------------- the loader


@pytest.fixture
def shards(tmp_path):
    good_shards(tmp_path / "s", [12, 12])
    return tmp_path / "s"


def batches(shards, photometric_on: str, steps: int = 3, start: int = 0, **overrides) -> list:
    cfg = tiny_cfg(shards, **{"views.photometric_on": photometric_on, **overrides})
    loader = Loader(LoaderSpec(cfg, "train", 4, 0, 1, seed=5))
    loader.load_state_dict({"position": start * 4})
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == steps:
            break
    return out


def test_auto_is_the_device_for_cuda_batches_and_the_cpu_otherwise():
    assert resolve("auto", cuda=True) == "device" and resolve("auto", cuda=False) == "cpu"
    assert resolve("cpu", cuda=True) == "cpu" and resolve("device", cuda=False) == "device"


@pytest.mark.parametrize("kind", ["multicrop", "two_view"])
def test_cpu_and_device_modes_give_the_same_batch_layout_and_close_pixels(shards, kind):
    overrides = {"views.kind": kind, "views.interpolation": "bilinear"} if kind == "two_view" else {}
    (cpu,) = batches(shards, "cpu", 1, **overrides)
    (split,) = batches(shards, "device", 1, **overrides)
    assert split.photometric is not None and all(c.dtype == torch.uint8 for c in split.crops)
    landed = split.to(torch.device("cpu"))
    assert landed.photometric is None
    assert landed.views_per_group == cpu.views_per_group and landed.keys == cpu.keys
    assert torch.equal(landed.labels, cpu.labels)
    for ours, theirs in zip(landed.crops, cpu.crops):
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype == torch.float32
        # the same draws from the same generator: only PIL's uint8 rounding between ops, its integer mean for the
        # contrast and its box-blur approximation differ (normalised units: 1/255/0.225 = 0.017 per grey level)
        diff = (ours - theirs).abs()
        assert diff.mean() < 0.05, diff.mean()


def test_a_resumed_loader_ships_the_same_crops_and_parameters(shards):
    full = batches(shards, "device", 3)
    resumed = batches(shards, "device", 2, start=1)
    for a, b in zip(full[1:], resumed):
        assert a.keys == b.keys
        for x, y in zip(a.crops, b.crops):
            assert torch.equal(x, y)
        for x, y in zip(a.photometric.params, b.photometric.params):
            assert torch.equal(x, y)
        assert all(torch.equal(x, y) for x, y in zip(a.to("cpu").crops, b.to("cpu").crops))


@pytest.mark.slow  # a process group (gloo, one rank)
@pytest.mark.parametrize("recipe", ["demo/dino_tiny", "demo/mocov3_tiny"])
def test_the_step_runs_on_batches_of_both_modes(group, tmp_path, recipe):
    from scale.config import load_recipe
    from scale.loop.step import TrainStep, read_record

    info, device = group
    good_shards(tmp_path / "s", [16])
    losses = {}
    for mode in ("cpu", "device"):
        overrides = [f"data.train={tmp_path / 's'}", f"data.views.photometric_on={mode}", "train.global_batch=8"]
        overrides += ["train.knn_monitor_every=0", "data.views.n_local=[2]"] if "dino" in recipe else []
        cfg = load_recipe(recipe, overrides)
        step = TrainStep(cfg, info, device, lambda cfg=cfg: Loader(LoaderSpec(cfg.data, "train", 8, 0, 1, seed=0)))
        batch, _ = step.next_batch(step.batches())
        assert batch.photometric is None and batch.crops[0].dtype == torch.float32
        losses[mode] = read_record(step(0, batch))["loss"]
    assert all(np.isfinite(v) for v in losses.values())
    # the same draws, so nearly the same crops: the same weights (seeded) give nearly the same first loss
    assert losses["cpu"] == pytest.approx(losses["device"], rel=0.05)

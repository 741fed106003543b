"""data.backend=dali in CPU mode: the same batches as the torchvision backend (layout, dtype), the same per-view
augmentation statistics, rank sharding and exact resume; a clear error without a GPU.
(What needs no DALI installed: test_dali_errors.py, and DALI's index files: test_dali_index.py.)"""

import math
import random

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali", reason="DALI not installed (pip install 'scale[dali]')")

from scale.data.dali.loader import DaliLoader, resolve_device  # noqa: E402
from scale.data.dali.pipeline import PARAMS, build_pipeline  # noqa: E402
from scale.data.factory import build_loader  # noqa: E402
from scale.data.spec import LoaderSpec  # noqa: E402
from scale.data.views import random_resized_crop_box  # noqa: E402
from scale.errors import UserError  # noqa: E402
from tests.data.helpers import tiny_cfg  # noqa: E402

GLOBAL, LOCAL, N_LOCAL = 32, 16, 4


@pytest.fixture(scope="module")
def photos(embedded_data):
    """1200 train crops of 12 photos, 64x64 JPEGs, in 5 shards."""
    return embedded_data / "embedded" / "photos" / "train"


def photos_cfg(train, backend="dali", **overrides):
    cfg = tiny_cfg(train, backend=backend, dali_device="cpu", shuffle_buffer=64, **overrides)
    cfg.views.global_size, cfg.views.local_sizes, cfg.views.n_local = GLOBAL, [LOCAL], [N_LOCAL]
    return cfg


def test_gpu_requested_without_gpu_is_a_user_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA GPU"):
        resolve_device("gpu")
    assert resolve_device("auto") == "cpu"


def test_batches_have_the_torchvision_layout_and_dtype(photos):
    dali = build_loader(LoaderSpec(photos_cfg(photos), "train", 8, 0, 1, seed=0))
    torchvision = build_loader(LoaderSpec(photos_cfg(photos, backend="torchvision"), "train", 8, 0, 1, seed=0))
    assert isinstance(dali, DaliLoader) and dali.steps_per_epoch == torchvision.steps_per_epoch
    a, b = next(iter(dali)), next(iter(torchvision))
    assert a.views_per_group == b.views_per_group == [2, N_LOCAL]
    assert [(c.shape, c.dtype, c.device) for c in a.crops] == [(c.shape, c.dtype, c.device) for c in b.crops]
    assert [c.shape[-1] for c in a.crops] == [GLOBAL, LOCAL]
    assert a.labels.dtype == b.labels.dtype == torch.int64 and a.labels.shape == b.labels.shape
    assert len(a.keys) == 8 and all(len(k) == 9 and k.isdigit() for k in a.keys)
    # normalised like the torchvision views: (x/255 - mean) / std of natural photos
    for x, y in zip(a.crops, b.crops):
        assert abs(x.mean() - y.mean()) < 0.5 and abs(x.std() - y.std()) < 0.3


def test_a_pinned_memory_spec_gives_dali_nothing_to_pin_and_the_cpu_views(photos):
    """DALI hands over its own buffers: the spec's pin_memory (set for a CUDA device) must not change its views."""
    loader = build_loader(LoaderSpec(photos_cfg(photos), "train", 8, 0, 1, seed=0, pin_memory=True))
    assert isinstance(loader, DaliLoader) and not loader.pin_memory and loader.views.photometric_on == "cpu"


def test_view_major_rows_are_views_of_the_same_image(photos):
    """Row v*B + i of a group is view v of image i: with the whole image as the only crop and no colour ops, the
    two global views of each image are equal, and differ from the other images'."""
    cfg = photos_cfg(photos)
    cfg.views.global_scale, cfg.views.ratio, cfg.views.flip_p = [1.0, 1.0], [1.0, 1.0], 0.0
    cfg.views.color_jitter_p, cfg.views.grayscale_p = 0.0, 0.0
    cfg.views.blur_p, cfg.views.solarize_p = [0.0, 0.0], [0.0, 0.0]
    batch = next(iter(build_loader(LoaderSpec(cfg, "train", 8, 0, 1, seed=0))))
    first, second = batch.crops[0][:8].flatten(1), batch.crops[0][8:].flatten(1)
    assert torch.equal(first, second)
    assert (torch.cdist(first, first) + torch.eye(8) * 1e9).min() > 1


def drawn_parameters(photos, samples: int) -> dict:
    """Per-view random draws of the loader's pipeline (expose=True returns the nodes the ops consume) and the
    crops, over `samples` images."""
    loader = DaliLoader(LoaderSpec(photos_cfg(photos), "train", 100, 0, 1, seed=5))
    pipe = build_pipeline(loader.spec(seed=11), expose=True)
    n_views = sum(loader.views.views_per_group)
    out = {name: [[] for _ in range(n_views)] for name in PARAMS + ("crop",)}
    for _ in range(samples // 100):
        outputs = pipe.run()
        crops, params = outputs[2 : 2 + n_views], outputs[2 + n_views :]
        for v in range(n_views):
            out["crop"][v].append(np.array(crops[v].as_tensor()))
            for p, name in enumerate(PARAMS):
                out[name][v].append(np.stack([np.array(t) for t in params[v * len(PARAMS) + p]]))
    return {name: [np.concatenate(per_view) for per_view in values] for name, values in out.items()}


def torchvision_crop_boxes(size: int, scale, ratio, n: int) -> tuple:
    rng = random.Random(0)
    boxes = np.array([random_resized_crop_box(rng, size, size, scale, ratio) for _ in range(n)], dtype=float)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return w * h / size**2, w / h


def is_gray(crops: np.ndarray, mean, std) -> np.ndarray:
    """Per crop: all three channels equal once the normalisation is undone."""
    pixels = crops * np.array(std).reshape(1, 3, 1, 1) * 255 + np.array(mean).reshape(1, 3, 1, 1) * 255
    return np.abs(pixels - pixels[:, :1]).max(axis=(1, 2, 3)) < 0.5


@pytest.mark.slow  # 1200 samples' draws through DALI's pipeline: tens of seconds, not a unit test
def test_per_view_statistics_match_the_torchvision_views(photos):
    samples = 1200
    drawn = drawn_parameters(photos, samples)
    views = photos_cfg(photos).views
    tolerance = lambda p: 4.5 * math.sqrt(max(p * (1 - p), 0.01) / samples)  # noqa: E731 (binomial, ~4.5 sigma)
    blur_p = list(views.blur_p) + [views.local_blur_p] * N_LOCAL
    solarize_p = list(views.solarize_p) + [views.local_solarize_p] * N_LOCAL
    for v in range(2 + N_LOCAL):
        shape, size = drawn["shape"][v], drawn["size"][v]
        assert (shape[:, :2] == 64).all()
        area, aspect = size.prod(axis=1) / 64**2, size[:, 1] / size[:, 0]  # size is (h, w)
        scale = views.global_scale if v < 2 else views.local_scale
        ref_area, ref_aspect = torchvision_crop_boxes(64, scale, views.ratio, 4000)
        for ours, ref in ((area, ref_area), (np.log(aspect), np.log(ref_aspect))):
            assert abs(ours.mean() - ref.mean()) < 0.02
            assert np.abs(np.quantile(ours, [0.1, 0.5, 0.9]) - np.quantile(ref, [0.1, 0.5, 0.9])).max() < 0.025
        for name, p in (
            ("flip", views.flip_p),
            ("jitter", views.color_jitter_p),
            ("gray", views.grayscale_p),
            ("blur", blur_p[v]),
            ("solarize", solarize_p[v]),
        ):
            assert abs(drawn[name][v].mean() - p) < tolerance(p), (name, v)
        blurred = drawn["sigma"][v][drawn["blur"][v] == 1]
        if len(blurred):
            assert views.blur_sigma[0] <= blurred.min() and blurred.max() <= views.blur_sigma[1]
        assert set(np.unique(drawn["order"][v])) == set(range(24))  # every order of the four jitter ops
        # the coin is the one the op consumed: every greyed crop is grey
        assert is_gray(drawn["crop"][v][drawn["gray"][v] == 1], views.mean, views.std).all()


@pytest.mark.slow  # an epoch through both backends
def test_greyscale_rate_of_the_crops_matches_torchvision(photos):
    """Measured on the crops themselves over one epoch (every image once on both backends): 2 of the 12 photos are
    grey, the others are greyed with p 0.2, so a third of the crops are grey."""
    rates = {}
    for backend in ("dali", "torchvision"):
        cfg = photos_cfg(photos, backend=backend)
        cfg.views.n_local = [1]  # only the global crops are measured
        loader = build_loader(LoaderSpec(cfg, "train", 100, 0, 1, seed=1))
        grey = [is_gray(b.crops[0].numpy(), cfg.views.mean, cfg.views.std) for b in loader]
        rates[backend] = np.concatenate(grey).mean()
    expected = 2 / 12 + 10 / 12 * cfg.views.grayscale_p
    assert abs(rates["dali"] - expected) < 0.05 and abs(rates["torchvision"] - expected) < 0.05, rates


def test_solarize_and_blur_change_the_crops_as_torchvision_does(photos):
    """The same pipeline seed with p 1 instead of 0 for one op: the crops are the op applied to the plain crops."""
    cfg = photos_cfg(photos)
    cfg.views.color_jitter_p, cfg.views.grayscale_p, cfg.views.flip_p = 0.0, 0.0, 0.0
    crops = {}
    for name, blur, solarize in (("plain", 0.0, 0.0), ("solarized", 0.0, 1.0), ("blurred", 1.0, 0.0)):
        cfg.views.blur_p, cfg.views.solarize_p = [blur, blur], [solarize, solarize]
        cfg.views.local_blur_p, cfg.views.local_solarize_p = blur, solarize
        batch = next(iter(build_loader(LoaderSpec(cfg, "train", 8, 0, 1, seed=2))))
        mean, std = torch.tensor(cfg.views.mean).view(1, 3, 1, 1), torch.tensor(cfg.views.std).view(1, 3, 1, 1)
        crops[name] = (batch.crops[0] * std + mean) * 255
    plain = crops["plain"].round()
    assert torch.allclose(crops["solarized"], torch.where(plain >= 128, 255 - plain, plain), atol=0.5)

    def roughness(x):
        return (x[..., 1:] - x[..., :-1]).abs().mean()

    assert roughness(crops["blurred"]) < 0.8 * roughness(crops["plain"])


def test_ranks_read_disjoint_parts(photos):
    keys = [set(), set()]
    for rank in (0, 1):
        loader = build_loader(LoaderSpec(photos_cfg(photos), "train", 32, rank, 2, seed=0))
        for _, batch in zip(range(4), loader):
            keys[rank].update(batch.keys)
    assert len(keys[0]) == len(keys[1]) == 64 and not keys[0] & keys[1]


def test_resume_continues_at_the_same_position_across_an_epoch(photos):
    cfg = photos_cfg(photos)
    first = build_loader(LoaderSpec(cfg, "train", 16, 0, 1, seed=4, samples_per_epoch=48))  # 3 steps per epoch
    list(first)
    next(iter(first))
    state = first.state_dict()
    assert state["position"] == 64 and first.epoch == 1 and first.step_in_epoch == 1
    expected = list(first)  # the rest of epoch 1
    resumed = build_loader(LoaderSpec(cfg, "train", 16, 0, 1, seed=4, samples_per_epoch=48))
    resumed.load_state_dict(state)
    got = list(resumed)
    assert len(got) == len(expected) == 2 and resumed.position == first.position == 96
    for a, b in zip(got, expected):
        assert a.keys == b.keys and torch.equal(a.labels, b.labels)
        assert all(torch.equal(x, y) for x, y in zip(a.crops, b.crops))


def test_resume_on_another_world_size_keeps_the_position(photos, caplog):
    cfg = photos_cfg(photos)
    first = build_loader(LoaderSpec(cfg, "train", 16, 0, 1, seed=4))
    next(iter(first))
    state = first.state_dict()
    other = build_loader(LoaderSpec(cfg, "train", 16, 1, 2, seed=4))
    other.load_state_dict(state)
    batch = next(iter(other))
    assert other.position == 32 and batch.batch_size == 8
    assert "fresh draw" in caplog.text

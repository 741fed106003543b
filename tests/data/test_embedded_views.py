"""Embedded demo data and the views made from ViewsConfig."""

import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from sklearn.neighbors import KNeighborsClassifier

from scale.data import embedded
from scale.data import views as views_mod
from scale.data.config import ViewsConfig
from scale.data.loader import ShardReader
from scale.data.shards.read import read_manifest
from scale.data.shards.verify import verify
from scale.data.views import build_views, random_resized_crop_box
from tests.data.helpers import jpeg


def pixels_and_labels(shard_dir):
    manifest = read_manifest(shard_dir)
    reader = ShardReader(shard_dir, manifest)
    x, y = [], []
    for shard, s in enumerate(manifest["shards"]):
        for i in range(s["count"]):
            _, data, label = reader.read(shard, i)
            x.append(views_mod.decode_rgb(data).resize((16, 16)))
            y.append(label)
    return np.stack([np.asarray(im, dtype=np.float32).ravel() for im in x]), np.array(y)


@pytest.mark.parametrize("name, n_train, n_val, chance", [("digits", 1437, 360, 0.1), ("photos", 1200, 300, 1 / 12)])
def test_embedded_builds_and_knn_is_a_real_signal(tmp_path, name, n_train, n_val, chance):
    dirs = embedded.build(name, tmp_path)
    assert read_manifest(dirs["train"])["num_samples"] == n_train
    assert read_manifest(dirs["val"])["num_samples"] == n_val and verify(dirs["val"]) == []
    xtr, ytr = pixels_and_labels(dirs["train"])
    xva, yva = pixels_and_labels(dirs["val"])
    accuracy = KNeighborsClassifier(5).fit(xtr, ytr).score(xva, yva)
    assert chance * 3 < accuracy < 1.0


def cfg(**kw):
    c = OmegaConf.structured(ViewsConfig())
    for k, v in kw.items():
        c[k] = v
    return c


def test_defaults_are_the_official_dino_ones():
    c = ViewsConfig()
    assert (c.global_size, c.global_scale, c.local_sizes, c.local_scale) == (224, [0.4, 1.0], [96], [0.05, 0.4])
    assert (c.blur_p, c.local_blur_p, c.solarize_p, c.local_solarize_p) == ([1.0, 0.1], 0.5, [0.0, 0.2], 0.0)
    assert (c.color_jitter, c.color_jitter_p, c.grayscale_p, c.interpolation) == (
        [0.4, 0.4, 0.2, 0.1],
        0.8,
        0.2,
        "bicubic",
    )


@pytest.mark.parametrize(
    "kind, extra, shapes",
    [
        ("multicrop", {"local_sizes": [12, 8], "n_local": [3, 2]}, [(2, 24), (3, 12), (2, 8)]),
        ("two_view", {"interpolation": "bilinear"}, [(2, 24)]),
        ("supervised", {}, [(1, 24)]),
        ("eval", {}, [(1, 20)]),
    ],
)
def test_view_shapes(kind, extra, shapes):
    v = build_views(cfg(kind=kind, global_size=24, eval_resize=28, eval_crop=20, **extra))
    out = v(jpeg(0, size=(90, 60)), random.Random(0))
    assert v.views_per_group == [n for n, _ in shapes]
    assert [(len(g), tuple(g[0].shape)) for g in out] == [(n, (3, s, s)) for n, s in shapes]


def test_blur_and_solarize_rates_follow_the_config(monkeypatch):
    counts = {"blur": 0, "solarize": 0}
    real_blur, real_solarize = views_mod.gaussian_blur, views_mod.solarize

    def counting_blur(rgb, radius):
        counts["blur"] += 1
        assert 0.1 <= radius <= 2.0
        return real_blur(rgb, radius)

    def counting_solarize(rgb):
        counts["solarize"] += 1
        return real_solarize(rgb)

    monkeypatch.setattr(views_mod, "gaussian_blur", counting_blur)
    monkeypatch.setattr(views_mod, "solarize", counting_solarize)
    v = build_views(cfg(global_size=16, local_sizes=[8], n_local=[4]))
    rng, data, n = random.Random(0), jpeg(1, size=(40, 40)), 400
    for _ in range(n):
        v(data, rng)
    assert abs(counts["blur"] / n - (1.0 + 0.1 + 4 * 0.5)) < 0.15  # official per-image expectation 3.1
    assert abs(counts["solarize"] / n - 0.2) < 0.06


def test_crop_boxes_follow_scale_and_ratio():
    rng = random.Random(0)
    for _ in range(500):
        l, t, r, b = random_resized_crop_box(rng, 500, 375, (0.05, 0.4), (3 / 4, 4 / 3))
        area = (r - l) * (b - t) / (500 * 375)
        assert 0.045 < area < 0.41 and 0.7 < (r - l) / (b - t) < 1.4 and 0 <= l < r <= 500 and 0 <= t < b <= 375


def test_reduced_decode_keeps_crop_geometry():
    """A crop served by a 1/2-size DCT decode matches the full-size crop closely (same box, same content)."""
    v = build_views(
        cfg(
            global_size=16,
            n_local=[0],
            local_sizes=[8],
            color_jitter_p=0.0,
            grayscale_p=0.0,
            blur_p=[0.0, 0.0],
            solarize_p=[0.0, 0.0],
            flip_p=0.0,
        )
    )
    rng_state = random.Random(3)
    data = jpeg(2, size=(200, 160))
    full = v.__class__._reduction
    crops = v(data, random.Random(3))[0]
    v._reduction = staticmethod(lambda spec, box: 1)
    reference = v(data, rng_state)[0]
    v._reduction = full
    for a, b in zip(crops, reference):
        assert (a.float() - b.float()).abs().mean() < 40  # random noise image: resampling differences only
    assert torch.is_tensor(crops[0]) and crops[0].dtype == torch.uint8


@pytest.mark.slow  # the command end to end: builds shards and runs both pipelines
def test_bench_data_command_runs(tmp_path, capsys):
    from scale.cli import main

    dirs = embedded.build("digits", tmp_path)
    assert (
        main(
            [
                "bench",
                "data",
                "recipes/_base/dino.yaml",
                "data.views.global_size=32",
                "data.views.local_sizes=[16]",
                "--shards",
                str(dirs["val"]),
                "--images",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "x official" in out and "photometric_on=device: CPU part" in out and "device part" in out
    assert main(["bench", "nothing"]) == 2

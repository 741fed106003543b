"""Backbone parameter and multiply-add counts against the papers (meta device: nothing is allocated)."""

from dataclasses import replace

import pytest
import torch

from scale.models import BACKBONES, build_backbone
from scale.models.complexity import count_forward, count_macs, count_params
from scale.models.config import ModelConfig
from scale.models.table import accepted_px, parse_spec, table


def meta(spec: str):
    return build_backbone(parse_spec(spec), device="meta")


# backbone only (no heads, no classifier); MoCo v3 Table 2 / DINO / Swin / torchvision ResNet-50 without fc
@pytest.mark.parametrize(
    "spec,millions",
    [
        ("vit_small", 21.7),
        ("vit_small/h12", 21.7),
        ("vit_base", 85.8),
        ("vit_large", 303.3),
        ("vit_huge", 630.8),
        ("resnet50", 23.5),
        ("swin_tiny", 28.0),
        ("swin_small", 49.0),
        ("swin_base", 87.0),
        ("swin_tiny/w14", 28.0),
        ("swin_base/w14", 87.0),
    ],
)
def test_parameter_counts(spec, millions):
    assert count_params(meta(spec)) / 1e6 == pytest.approx(millions, rel=0.02)


# MoCo v3 Table 3: multiply-adds per 224 crop
@pytest.mark.parametrize(
    "spec,giga",
    [
        ("vit_small", 4.6),
        ("vit_base", 17.5),
        ("vit_large", 61.3),
        ("vit_huge", 166.7),
        ("resnet50", 4.1),
    ],
)
def test_macs_per_224_crop(spec, giga):
    model = meta(spec)
    assert all(p.is_meta for p in model.parameters())
    assert count_macs(model, 224) / 1e9 == pytest.approx(giga, rel=0.02)


def test_patch_7_costs_about_six_times_patch_16():
    ratio = count_macs(meta("vit_large/7"), 224) / count_macs(meta("vit_large"), 224)
    assert 5.5 < ratio < 6.5  # MoCo v3: "increases FLOPs to ~6x"


def vit_macs(patch: int, size: int, dim: int, depth: int) -> int:
    """Analytic ViT multiply-adds: patch projection, then per block 12*N*D^2 linear + 2*N^2*D attention."""
    patches = (size // patch) ** 2
    tokens = patches + 1
    return patches * 3 * patch * patch * dim + depth * (12 * tokens * dim * dim + 2 * tokens * tokens * dim)


def test_attention_matmuls_are_counted_for_materialised_and_meta_models():
    model = build_backbone(ModelConfig(name="vit_nano", img_size=64))  # real weights: traced with fake tensors
    assert count_macs(model, 64) == vit_macs(8, 64, 64, 3)
    assert count_macs(model, 32) == vit_macs(8, 32, 64, 3)
    assert count_macs(meta("vit_huge"), 224) == vit_macs(14, 224, 1280, 32)
    model(torch.randn(1, 3, 32, 32))  # counting left the model usable


def test_swin_local_crops_do_not_pay_for_padded_windows():
    # EsViT's fixed window 14 pads 96 px maps to 28/14/14/7 (about 2x window 7); shrunk windows cost about the same
    w7, w14 = count_macs(meta("swin_tiny"), 96), count_macs(meta("swin_tiny/w14"), 96)
    assert w14 < 1.1 * w7


def test_table_rows():
    rows = list(table(["vit_large/7", "swin_nano/w14"]))
    assert [r["model"] for r in rows] == ["vit_large/7", "swin_nano/w14"]
    assert rows[0]["local_px"] == 98 and rows[0]["local_tokens"] == "14x14" and rows[0]["global_tokens"] == "32x32"
    assert rows[1]["local_px"] == 96 and rows[1]["local_tokens"] == "3x3"


NANOS = sorted(name for name in BACKBONES if name.endswith(("_nano", "_nano_w")))


@pytest.mark.parametrize("spec", [*NANOS, "swin_nano/w14", "vit_nano/8"])
def test_a_repeated_module_counted_once_counts_as_every_module_run(spec):
    """Each family's blocks (ViT, ViT-BN, Swin with shifted and padded windows, ResNet, CvT, PvT, ViL, T2T): the
    count that runs each repeated module once equals the count that runs every module, at a global and a local
    crop (96 px: padded windows for Swin)."""
    cfg = parse_spec(spec)
    model = build_backbone(replace(cfg, img_size=accepted_px(224, cfg.patch_size or 1)), drop_path=0.0, device="meta")
    for size in (224, 96):
        assert count_forward(model, size)[0] == count_forward(model, size, once=False)[0] > 0


def test_repeated_blocks_run_once_per_input_shape(monkeypatch):
    from scale.models.vit import ViTBlock

    runs = []
    forward = ViTBlock.forward
    monkeypatch.setattr(ViTBlock, "forward", lambda self, *a, **k: runs.append(self) or forward(self, *a, **k))
    model = build_backbone(parse_spec("vit_huge"), drop_path=0.0, device="meta")  # blocks alike, as in the table
    assert count_macs(model, 224) == vit_macs(14, 224, 1280, 32)  # 32 blocks, one run
    assert len(runs) == 1

"""`scale viz attention`: last-block attention of a ViT, 60%-mass masks, Jaccard on a made-up VOC12 layout."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from scale.checkpoint.weights import load_backbone
from scale.cli import main as cli
from scale.config import load_recipe
from scale.errors import UserError
from scale.models import build_backbone
from scale.viz import attention as attn
from scale.viz import voc

RECIPE = "demo/dino_tiny"
CLS_VIT = ["model.pooling=cls", "model.img_size=32", "model.patch_size=8"]


def tiny_vit(overrides=CLS_VIT):
    torch.manual_seed(0)
    return build_backbone(load_recipe(RECIPE, overrides).model).eval()


def test_mass_mask_keeps_the_most_attended_patches_holding_the_share():
    maps = torch.tensor([[[0.1, 0.4], [0.2, 0.3]]])
    # ascending 0.1 0.2 0.3 0.4 -> cumulative 0.1 0.3 0.6 1.0; > 0.4 keeps 0.3 and 0.4 (70% of the mass)
    assert attn.mass_mask(maps, 0.6).tolist() == [[[False, True], [False, True]]]
    assert attn.mass_mask(maps, 0.35).tolist() == [[[False, True], [False, False]]]
    assert attn.mass_mask(maps * 7, 0.6).tolist() == [[[False, True], [False, True]]]  # unnormalised
    with pytest.raises(UserError, match="threshold"):
        attn.mass_mask(maps, 1.5)


def test_jaccard_of_known_masks():
    mask = np.array([[1, 1, 0], [0, 1, 0]])
    truth = np.array([[1, 0, 0], [1, 1, 0]])
    assert attn.jaccard(mask, truth) == pytest.approx(2 / 4)
    void = np.array([[0, 0, 0], [1, 0, 0]])  # the truth-only pixel is void
    assert attn.jaccard(mask, truth, void) == pytest.approx(2 / 3)
    assert attn.jaccard(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0


def test_last_block_attention_reproduces_the_blocks_output():
    backbone = tiny_vit()
    images = torch.randn(2, 3, 32, 32)
    weights, grid = attn.last_block_attention(backbone, images)
    assert grid == (4, 4) and weights.shape == (2, 4, 17, 17)
    block = backbone.blocks[-1].attn
    captured = {}
    handle = block.register_forward_hook(lambda m, args, out: captured.update(x=args[0], out=out))
    backbone(images)
    handle.remove()
    x = captured["x"]
    v = block.qkv(x).reshape(2, 17, 3, 4, -1).permute(2, 0, 3, 1, 4)[2]
    out = block.proj((weights @ v).transpose(1, 2).reshape(2, 17, -1))
    torch.testing.assert_close(out, captured["out"], atol=1e-5, rtol=1e-4)
    maps = attn.attention_maps(backbone, images)
    torch.testing.assert_close(maps, weights[:, :, 0, 1:].reshape(2, 4, 4, 4))
    pooled = attn.attention_maps(tiny_vit(["model.img_size=32", "model.patch_size=8"]), images)
    torch.testing.assert_close(pooled.sum(dim=(2, 3)), torch.ones(2, 4))  # mean patch query: no prefix token


def make_voc(root, names=("2007_000001", "2007_000002")):
    (root / "ImageSets" / "Segmentation").mkdir(parents=True)
    (root / "JPEGImages").mkdir()
    (root / "SegmentationClass").mkdir()
    (root / "ImageSets" / "Segmentation" / "val.txt").write_text("\n".join(names) + "\n")
    rng = np.random.default_rng(0)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "JPEGImages" / f"{name}.jpg")
        labels = np.zeros((40, 48), np.uint8)
        labels[8:30, 10:40] = 15  # a person
        labels[8, 10:40] = 255  # void border
        png = Image.fromarray(labels, mode="P")
        png.putpalette([0, 0, 0, 128, 0, 0] * 128)
        png.save(root / "SegmentationClass" / f"{name}.png")
    return root


def test_voc_layout_is_read_and_a_missing_file_is_named(tmp_path):
    root = make_voc(tmp_path / "VOC2012")
    samples = voc.read_voc(root, "val")
    assert [s.name for s in samples] == ["2007_000001", "2007_000002"]
    fg, void = voc.read_foreground(samples[0].mask, 32, (32, 32))  # 40x48 -> 32x38, cut to 32x32
    assert fg.shape == (32, 32) and void.any() and not (fg & void).any()
    assert fg.sum() == pytest.approx(21 * 0.8 * (32 - 10 * 0.8), rel=0.15)  # rows 8..30, columns 8..32 of 32x38
    fg_kept, _ = voc.read_foreground(samples[0].mask, None, (40, 48))
    assert fg_kept.sum() == 22 * 30 - 30  # rows 8..29 and columns 10..39, the void first row left out
    (root / "SegmentationClass" / "2007_000002.png").unlink()
    with pytest.raises(UserError, match="2007_000002.png"):
        voc.read_voc(root, "val")
    with pytest.raises(UserError, match="ImageSets/Segmentation/train.txt"):
        voc.read_voc(root, "train")


def test_voc_jaccard_equals_the_per_head_masks(tmp_path):
    samples = voc.read_voc(make_voc(tmp_path / "VOC2012"), "val")
    backbone = tiny_vit()
    mean, std = [0.5] * 3, [0.25] * 3
    result = voc.evaluate(backbone, samples, 0.6, 32, mean, std)
    assert result["images"] == 2 and len(result["jaccard_per_head"]) == 4
    from scale.eval.images import read_rgb, to_input

    by_hand = []
    for sample in samples:
        image = to_input(read_rgb(sample.image), 32, 8, mean, std)
        masks = attn.upsample(attn.mass_mask(attn.attention_maps(backbone, image[None])[0], 0.6), (32, 32))
        fg, void = voc.read_foreground(sample.mask, 32, (32, 32))
        by_hand.append([attn.jaccard(m.numpy() > 0, fg, void) for m in masks])
    expected = 100 * np.mean(by_hand, axis=0)
    np.testing.assert_allclose(result["jaccard_per_head"], expected)
    assert result["jaccard_best_head"] == pytest.approx(expected.max())


def test_cli_draws_pictures_and_scores_voc(tmp_path, capsys):
    root = make_voc(tmp_path / "VOC2012")
    out = tmp_path / "viz"
    args = ["viz", "attention", RECIPE, *CLS_VIT, "--random-init", "--voc", str(root), "--image-size", "32"]
    assert cli([*args, "--out", str(out)]) == 0
    assert (out / "attention_2007_000001.png").stat().st_size > 2000
    result = json.loads((out / "attention.json").read_text())
    # the command scores the recipe's seeded random init on the VOC split as voc.evaluate does
    cfg = load_recipe(RECIPE, CLS_VIT)
    torch.manual_seed(cfg.train.seed)
    backbone = load_backbone(cfg.model, None, torch.device("cpu"))
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    expected = voc.evaluate(backbone, voc.read_voc(root, "val", None), 0.6, 32, mean, std)
    scored = result["jaccard"]["random init"]
    assert scored["jaccard_per_head"] == pytest.approx(expected["jaccard_per_head"])
    assert scored["best_head"] == expected["best_head"] and scored["images"] == expected["images"] == 2
    (root / "JPEGImages" / "2007_000001.jpg").unlink()
    assert cli([*args, "--out", str(out)]) == 2
    assert "2007_000001.jpg" in capsys.readouterr().err


def test_cli_refuses_backbones_without_global_attention(capsys):
    code = cli(["viz", "attention", "demo/esvit_tiny", "--random-init", "--image", "x.png"])
    assert code == 2 and "not a ViT" in capsys.readouterr().err


def test_report_shows_the_pictures_of_a_run(tmp_path):
    from scale.config import to_yaml
    from scale.report import write_report

    run = tmp_path / "run"
    (run / "viz").mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(load_recipe(RECIPE)))
    Image.new("RGB", (8, 8)).save(run / "viz" / "attention_cat.png")
    report = write_report([run], tmp_path / "report")
    assert "![attention_cat](run_attention_cat.png)" in report.read_text()
    assert (tmp_path / "report" / "run_attention_cat.png").is_file()


def test_run_dir_puts_pictures_and_jaccard_in_the_report(tmp_path):
    root = make_voc(tmp_path / "VOC2012", names=("2007_000001",))
    run = tmp_path / "run"
    shrink = ["model.name=vit_nano", "model.img_size=32", "model.patch_size=8"]
    args = ["viz", "attention", "dino/fig4/vit_s16", *shrink, "--random-init", "--voc", str(root)]
    assert cli([*args, "--image-size", "32", "--run-dir", str(run)]) == 0
    assert (run / "viz" / "attention_2007_000001.png").is_file() and (run / "eval" / "attention.json").is_file()
    assert cli(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| dino/fig4/vit_s16 | fig4 |"))
    assert "jaccard_dino 45.9" in row and "Jaccard random init" in row
    assert "![attention_2007_000001](run_attention_2007_000001.png)" in text


def test_report_headlines_of_every_protocol(tmp_path):
    from scale.report import protocol_table

    evals = {
        "retrieval_roxford5k": {"dataset": "roxford5k", "medium_map": 41.84, "hard_map": 13.66},
        "copy_detection": {"strong_map": 81.66},
        "video_segmentation": {"jf_mean": 61.8, "j_mean": 60.2, "f_mean": 63.4},
        "knn": {"top1": 70.0},
    }
    run = {"config": load_recipe("dino/table3/vit_s16"), "evals": evals}
    rows = [line for line in protocol_table([run]) if line.startswith("| dino/table3/vit_s16")]
    assert [row.split(" | ")[3] for row in rows] == ["retrieval_roxford5k", "copy_detection", "video_segmentation"]
    assert rows[0].endswith("| roxford5k mAP M 41.8, H 13.7 |") and rows[1].endswith("| strong mAP 81.7 |")
    assert "roxford_m 41.8" in rows[0]

"""`scale eval video-segmentation`: DAVIS J and F on known masks, label propagation on toy features, and the
DAVIS 2017 layout made up on disk."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from scale.cli import main as cli
from scale.errors import UserError
from scale.eval import davis_metrics as dm
from scale.eval import video_segmentation as vos

TINY_VIT = ["model.img_size=32", "model.patch_size=8"]


def square(top, left, size=5, shape=(20, 20)):
    mask = np.zeros(shape, bool)
    mask[top : top + size, left : left + size] = True
    return mask


def test_region_similarity_of_known_masks():
    truth, pred = square(5, 5), square(5, 8)  # 5x2 overlap, union 25 + 25 - 10
    assert dm.region_similarity(truth, pred) == pytest.approx(10 / 40)
    void = np.zeros_like(truth)
    void[:, 10:] = True  # hides pred's 3 columns outside truth
    assert dm.region_similarity(truth, pred, void) == pytest.approx(10 / 25)
    empty = np.zeros_like(truth)
    assert dm.region_similarity(empty, empty) == 1.0


def test_boundary_map_is_the_outline_offset_towards_the_origin():
    outline = dm.boundary_map(square(5, 5))
    expected = np.zeros((20, 20), bool)
    expected[4, 4:10] = expected[9, 4:10] = expected[4:10, 4] = expected[4:10, 9] = True
    np.testing.assert_array_equal(outline, expected)


def test_boundary_f_measure_of_known_masks():
    truth = square(5, 5)
    # 20x20: tolerance ceil(0.008 * 28.3) = 1 px (a 3x3 cross). Shifted 3 columns, 10 of the 20 outline pixels of
    # each side lie within 1 px of the other's (4 on the top row, 4 on the bottom, the 2 ends of the inner side):
    # precision = recall = 0.5
    assert dm.boundary_f_measure(truth, square(5, 8)) == pytest.approx(0.5)
    assert dm.boundary_f_measure(truth, square(5, 6)) == pytest.approx(1.0)  # within the tolerance
    assert dm.boundary_f_measure(truth, np.zeros_like(truth)) == 0.0
    assert dm.boundary_f_measure(np.zeros_like(truth), np.zeros_like(truth)) == 1.0


def test_score_video_leaves_out_the_first_and_last_frames():
    truth = [np.where(square(5, 5), 1, 0).astype(np.uint8)] * 4
    pred = [np.zeros((20, 20), np.uint8), truth[0], np.zeros((20, 20), np.uint8), np.zeros((20, 20), np.uint8)]
    scores = dm.score_video(truth, pred)
    assert scores["J"] == [pytest.approx(0.5)] and scores["F"] == [pytest.approx(0.5)]


def test_neighbourhood_and_propagation_on_toy_features():
    np.testing.assert_array_equal(vos.neighbourhood_mask(1, 3, 1).numpy(), [[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    feats = torch.eye(4)  # 4 patches with orthogonal features: each matches only itself
    masks = torch.tensor([[1.0, 0, 0, 1], [0, 1, 1, 0]])
    torch.testing.assert_close(vos.propagate(feats, [feats], [masks], topk=1, near=None), masks)
    # two equally similar sources (the same frame twice) with different masks: top-2 averages them
    other = torch.tensor([[0.0, 1, 1, 0], [1, 0, 0, 1]])
    torch.testing.assert_close(vos.propagate(feats, [feats, feats], [masks, other], 2, None), torch.full((2, 4), 0.5))
    # a neighbourhood of 0 patches on a 1x4 grid keeps only the same position even when features disagree
    shuffled = feats[[1, 0, 3, 2]]
    near = vos.neighbourhood_mask(1, 4, 0)
    torch.testing.assert_close(vos.propagate(feats, [shuffled], [masks], 1, near), masks)


def make_davis(root, videos=("bear", "cows"), frames=3):
    (root / "ImageSets" / "2017").mkdir(parents=True)
    (root / "ImageSets" / "2017" / "val.txt").write_text("\n".join(videos) + "\n")
    rng = np.random.default_rng(0)
    for video in videos:
        (root / "JPEGImages" / "480p" / video).mkdir(parents=True)
        (root / "Annotations" / "480p" / video).mkdir(parents=True)
        for index in range(frames):
            image = rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)
            Image.fromarray(image).save(root / "JPEGImages" / "480p" / video / f"{index:05d}.jpg")
            labels = np.zeros((48, 64), np.uint8)
            labels[10:30, 10 + 4 * index : 30 + 4 * index] = 1
            labels[32:44, 40:60] = 2
            png = Image.fromarray(labels, mode="P")
            png.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * 759)
            png.save(root / "Annotations" / "480p" / video / f"{index:05d}.png")
    return root


def test_davis_layout_is_read_and_a_missing_file_is_named(tmp_path):
    root = make_davis(tmp_path / "DAVIS")
    videos = vos.read_davis(root)
    assert [v.name for v in videos] == ["bear", "cows"] and len(videos[0].frames) == 3
    assert vos.read_labels(videos[0].annotations[0]).max() == 2
    (root / "Annotations" / "480p" / "cows" / "00001.png").unlink()
    with pytest.raises(UserError, match="cows/00001.png"):
        vos.read_davis(root)
    with pytest.raises(UserError, match="ImageSets/2017/test.txt"):
        vos.read_davis(root, "test")


def test_input_size_follows_dino():
    assert vos.input_size(480, 854, 480) == (480, 832)  # 854 floored to a multiple of 64
    assert vos.input_size(854, 480, 480) == (832, 480)


def test_cli_scores_a_made_up_davis(tmp_path, capsys):
    root = make_davis(tmp_path / "DAVIS")
    out, masks = tmp_path / "vos.json", tmp_path / "masks"
    args = ["eval", "video-segmentation", "demo/dino_tiny", *TINY_VIT, "--random-init", "--davis", str(root)]
    assert cli([*args, "--short-side", "64", "--out", str(out), "--save-masks", str(masks)]) == 0
    result = json.loads(out.read_text())
    assert result["objects"] == 4 and set(result["videos"]) == {"bear", "cows"}
    # the reported J and F are those of the masks it saved, scored against the annotations
    scores = {"J": [], "F": []}
    for video in vos.read_davis(root):
        saved = [vos.read_labels(masks / video.name / f"{frame.stem}.png") for frame in video.frames]
        for key, values in dm.score_video([vos.read_labels(a) for a in video.annotations], saved).items():
            scores[key] += values
    assert result["j_mean"] == pytest.approx(100 * np.mean(scores["J"]))
    assert result["f_mean"] == pytest.approx(100 * np.mean(scores["F"]))
    assert result["jf_mean"] == pytest.approx((result["j_mean"] + result["f_mean"]) / 2)
    with Image.open(masks / "bear" / "00002.png") as png:
        assert png.mode == "P" and png.size == (64, 48)
    (root / "ImageSets" / "2017" / "val.txt").unlink()
    assert cli([*args, "--out", str(out)]) == 2
    assert "ImageSets/2017/val.txt" in capsys.readouterr().err


def test_table5_recipe_result_lands_in_the_report(tmp_path, monkeypatch):
    seen, evaluate = {}, vos.evaluate

    def spy(backbone, videos, cfg, mean, std, *rest):
        seen["mean"], seen["std"] = mean, std
        return evaluate(backbone, videos, cfg, mean, std, *rest)

    monkeypatch.setattr(vos, "evaluate", spy)
    root = make_davis(tmp_path / "DAVIS", videos=("bear",))
    run = tmp_path / "run"
    shrink = ["model.name=vit_nano", "model.img_size=32", "model.patch_size=8"]
    args = ["eval", "video-segmentation", "dino/table5/vit_s16", *shrink, "--random-init", "--davis", str(root)]
    assert cli([*args, "--short-side", "64", "--run-dir", str(run)]) == 0
    # frames normalised as eval_video_segmentation.py's color_normalize does (std 0.228 for red, not 0.229)
    assert (seen["mean"], seen["std"]) == ([0.485, 0.456, 0.406], [0.228, 0.224, 0.225])
    result = json.loads((run / "eval" / "video_segmentation.json").read_text())
    assert cli(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| dino/table5/vit_s16 | table5 |"))
    assert "jf_mean 61.8" in row and f"J&F {result['jf_mean']:.1f}" in row

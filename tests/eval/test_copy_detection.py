"""`scale eval copy-detection`: Copydays strong mAP on known rankings, DINO's whitening, and the layout made up on
disk."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from scale.cli import main as cli
from scale.errors import UserError
from scale.eval import copy_detection as cd

TINY_VIT = ["model.pooling=cls", "model.img_size=32", "model.patch_size=8"]


def test_whitening_makes_the_second_moment_the_identity():
    features = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 1.0], [0.0, -1.0]])  # covariance diag(2, 0.5), mean 0
    mean, projection = cd.learn_whitening(features)
    torch.testing.assert_close(mean, torch.zeros(2, dtype=torch.float64))
    whitened = cd.whiten(features, mean, projection)
    torch.testing.assert_close(whitened.abs().max(dim=0).values, torch.tensor([2 / 2**0.5, 1 / 0.5**0.5]))
    torch.testing.assert_close(whitened.T @ whitened / 4, torch.eye(2))


def test_mean_ap_of_a_known_ranking():
    database = torch.eye(3)
    queries = torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.0, 1.0]])
    # query 0 ranks [0, 1, 2]: its positive 1 at rank 1 -> (0/1 + 1/2) / 2; query 1 finds its positive 2 first
    assert cd.mean_ap(queries, database, [[1], [2]], top=20) == pytest.approx(100 * (0.25 + 1.0) / 2)
    assert cd.mean_ap(queries, database, [[1], [2]], top=1) == pytest.approx(100 * (0.0 + 1.0) / 2)


def test_positives_share_the_4_character_prefix(tmp_path):
    originals = [tmp_path / "200000.jpg", tmp_path / "200100.jpg"]
    queries = [tmp_path / "200100_crop.jpg", tmp_path / "209900.jpg"]
    assert cd.positives_of(queries, originals) == [[1], []]


def make_copydays(root):
    rng = np.random.default_rng(0)
    for folder in ("original", "strong", "distractors"):
        (root / folder).mkdir(parents=True)
    for index in range(3):
        name = f"200{index}00.jpg"
        Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(root / "original" / name)
        (root / "strong" / name).write_bytes((root / "original" / name).read_bytes())  # an exact copy
        Image.fromarray(rng.integers(0, 255, (30, 30, 3), dtype=np.uint8)).save(root / "distractors" / f"d{index}.png")
    return root


def test_layout_is_read_and_a_missing_folder_is_named(tmp_path):
    root = make_copydays(tmp_path / "copydays")
    data = cd.read_inputs(root, str(root / "distractors"), None)
    assert len(data.originals) == len(data.queries) == 3 and data.whitening == data.distractors
    with pytest.raises(UserError, match="whitening_set"):
        cd.read_inputs(root, None, str(root / "whitening_set"))
    for path in (root / "strong").iterdir():
        path.unlink()
    (root / "strong").rmdir()
    with pytest.raises(UserError, match="copydays/strong"):
        cd.read_inputs(root, None, None)


def test_cli_finds_the_copies(tmp_path, capsys):
    root = make_copydays(tmp_path / "copydays")
    out = tmp_path / "cd.json"
    args = ["eval", "copy-detection", "demo/dino_tiny", *TINY_VIT, "--random-init", "--copydays", str(root)]
    assert cli([*args, "--distractors", str(root / "distractors"), "--imsize", "32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    # exact copies: cosine 1 after whitening too, ranked first
    assert result["strong_map"] == pytest.approx(100.0) and result["distractors"] == 3
    assert result["descriptor_dim"] == 2 * 64 and result["whitening_from"] == "distractors"
    assert cli([*args, "--distractors", str(tmp_path / "nowhere")]) == 2
    assert "nowhere" in capsys.readouterr().err

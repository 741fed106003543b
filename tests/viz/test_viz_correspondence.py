"""`scale viz correspondence`: the top matches between an image and its flipped view, drawn (EsViT Fig. 8)."""

import numpy as np
import torch
from PIL import Image
from torch import nn

from scale.cli import main as cli
from scale.viz import correspondence_picture as viz


class SortedPatches(nn.Module):
    """Tokens that a horizontal flip permutes exactly: the sorted pixel values of each 4x4 patch."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, images):
        patches = nn.functional.unfold(images, 4, stride=4).transpose(1, 2)  # [B, N, 48]
        return {"tokens": patches.sort(dim=-1).values - 0.5, "grid": (images.shape[2] // 4, images.shape[3] // 4)}


def test_centres_of_token_indices():
    np.testing.assert_allclose(viz.centres(torch.tensor([0, 3, 4]), (2, 4), (16, 32)), [[4, 4], [28, 4], [4, 12]])


def test_matches_of_a_flip_permuting_backbone_are_all_at_the_mirror():
    image = torch.rand(3, 16, 24, generator=torch.Generator().manual_seed(0))
    found = viz.matches(SortedPatches(), image, image.flip(-1), top=5)
    assert found["correct"].all() and len(found["correct"]) == 5
    np.testing.assert_allclose(found["to"][:, 0], 24 - found["from"][:, 0])  # mirrored x, same y
    np.testing.assert_allclose(found["to"][:, 1], found["from"][:, 1])
    shifted = viz.matches(SortedPatches(), image, image, top=5)  # unflipped: matches sit at the same place
    assert not shifted["correct"].any()


def test_cli_draws_the_matches(tmp_path):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(tmp_path / "x.png")
    args = ["viz", "correspondence", "demo/dino_tiny", "model.img_size=32", "model.patch_size=8", "--random-init"]
    assert cli([*args, "--image", str(tmp_path / "x.png"), "--image-size", "32", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "correspondence_x.png").stat().st_size > 2000

"""scale/viz/draw.py: the backbones `scale viz` draws, one per --weights [LABEL=]FILE (labelled by the file's stem
unless named) and the recipe's seeded random init; two with one label, or none, are refused (exit 2). The pictures
themselves: tests/viz/test_viz_attention.py and test_viz_correspondence.py (through the command line)."""

import pytest
import torch
from safetensors.torch import save_file

from scale.config import load_recipe
from scale.errors import UserError
from scale.models import build_backbone
from scale.viz.draw import Backbones

RECIPE = "demo/dino_tiny"
TINY = ["model.img_size=32", "model.patch_size=8"]


def test_each_weights_file_is_one_labelled_backbone_and_random_init_the_seeded_one(tmp_path):
    cfg = load_recipe(RECIPE, TINY)
    torch.manual_seed(123)  # another network than the recipe's seed gives
    trained = build_backbone(cfg.model)
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(tmp_path / "teacher.safetensors"))
    weights = [str(tmp_path / "teacher.safetensors"), f"dino={tmp_path / 'teacher.safetensors'}"]
    _, backbones = Backbones(RECIPE, TINY, None, weights, random_init=True).load("attention")
    assert list(backbones) == ["teacher", "dino", "random init"]
    for label in ("teacher", "dino"):
        torch.testing.assert_close(backbones[label].state_dict(), trained.state_dict())
    torch.manual_seed(cfg.train.seed)
    torch.testing.assert_close(backbones["random init"].state_dict(), build_backbone(cfg.model).state_dict())
    assert not any(p.requires_grad for p in backbones["dino"].parameters())


def test_two_backbones_with_one_label_or_none_are_refused():
    with pytest.raises(UserError, match="two backbones labelled 'x'"):
        Backbones(RECIPE, TINY, None, ["a/x.pt", "b/x.pt"], random_init=False).load("attention")
    with pytest.raises(UserError, match="scale viz correspondence: give --weights"):
        Backbones(RECIPE, TINY, None, [], random_init=False).load("correspondence")

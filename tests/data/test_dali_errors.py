"""data.backend switch without DALI installed: a clear message naming the extra; unknown backends; views the DALI
backend does not make come from the torchvision loader."""

import sys

import pytest

from scale.config import load_recipe
from scale.data.factory import build_loader
from scale.data.loader import Loader
from scale.data.spec import LoaderSpec
from scale.errors import ConfigError, UserError
from tests.data.helpers import good_shards, tiny_cfg


def test_missing_dali_names_the_extra(tmp_path, monkeypatch):
    good_shards(tmp_path, [8])
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import fails as when the extra is not installed
    with pytest.raises(UserError, match=r"pip install 'scale\[dali\]'"):
        build_loader(LoaderSpec(tiny_cfg(tmp_path, backend="dali"), "train", 4, 0, 1, seed=0))


def test_unknown_backend_is_refused_when_the_recipe_loads():
    with pytest.raises(ConfigError, match="data.backend='nvjpeg' is not one of: torchvision, dali"):
        load_recipe("demo/dino_tiny", ["data.backend=nvjpeg"])


def test_views_dali_does_not_make_come_from_the_torchvision_loader(tmp_path):
    good_shards(tmp_path, [8])
    cfg = tiny_cfg(tmp_path, backend="dali", **{"views.kind": "eval"})
    assert type(build_loader(LoaderSpec(cfg, "val", 4, 0, 1, seed=0))) is Loader

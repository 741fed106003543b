"""scale/data/spec.py: one LoaderSpec, checked when it is built (before any file is read), read by both backends."""

import dataclasses

import pytest

from scale.data.factory import build_loader
from scale.data.spec import LoaderSpec
from scale.errors import UserError
from tests.data.helpers import good_shards, tiny_cfg


@pytest.mark.parametrize(
    ("split", "global_batch", "message"),
    [
        ("test", 4, "split must be train or val, got 'test'"),
        ("train", 6, "train.global_batch=6 must be a positive multiple of the world size 4"),
        ("train", 0, "train.global_batch=0 must be a positive multiple"),
    ],
)
def test_a_bad_request_fails_when_the_spec_is_built(tmp_path, split, global_batch, message):
    with pytest.raises(UserError, match=message):
        LoaderSpec(tiny_cfg(tmp_path / "no-shards-here"), split, global_batch, 0, 4, seed=0)


def test_the_spec_reads_the_split_and_views_it_names(tmp_path):
    cfg = tiny_cfg(tmp_path / "t")
    cfg.val = str(tmp_path / "v")
    val = LoaderSpec(cfg, "val", 8, 1, 2, seed=0)
    assert val.shard_dir == tmp_path / "v" and val.local_batch == 4 and val.views is cfg.views
    eval_views = tiny_cfg(tmp_path, **{"views.kind": "eval"}).views
    assert LoaderSpec(cfg, "train", 8, 0, 2, seed=0, views=eval_views).views is eval_views
    with pytest.raises(dataclasses.FrozenInstanceError):
        val.rank = 0


def test_the_loader_takes_its_share_and_views_from_the_spec(tmp_path):
    good_shards(tmp_path / "t", [10])
    good_shards(tmp_path / "v", [6], start_key=100)
    cfg = tiny_cfg(tmp_path / "t", **{"val": str(tmp_path / "v"), "views.kind": "eval"})
    loader = build_loader(LoaderSpec(cfg, "val", 4, 1, 2, seed=0))
    assert (loader.rank, loader.world_size, loader.local_batch, loader.steps_per_epoch) == (1, 2, 2, 1)
    (batch,) = list(loader)
    assert len(batch.keys) == 2 and all(int(key) >= 100 for key in batch.keys)  # read from data.val
    assert batch.views_per_group == [1]  # the eval views: one center crop

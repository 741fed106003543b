"""Bad input in shards: skipped, counted per rank, fatal past the error budget; missing files fail at start."""

import json

import pytest

from scale.data.factory import build_loader
from scale.data.shards.write import build_shards
from scale.data.sources import imagefolder
from scale.data.spec import LoaderSpec
from scale.errors import UserError
from tests.data.helpers import good_shards, jpeg, make_imagefolder, tiny_cfg, write_manifest, write_tar


def shards_with(tmp_path, bad: dict, counts: dict | None = None):
    """s0.tar: 8 good samples; s1.tar: the bad members `bad` ({key: members}) after 4 good ones."""
    good_shards(tmp_path, [8])
    samples = [(f"g{i}", {"jpg": jpeg(100 + i), "cls": b"1"}) for i in range(4)]
    write_tar(tmp_path / "s1.tar", samples + list(bad.items()))
    write_manifest(tmp_path, counts or {"s0.tar": 8, "s1.tar": 4 + len(bad)})
    return tiny_cfg(tmp_path, error_budget=0.5)


CASES = {
    "decode": {"badjpeg": {"jpg": jpeg(1)[:200] + b"\0" * 50, "cls": b"0"}},
    "not_image": {"text": {"txt": b"hello", "cls": b"0"}},
    "missing_label": {"nolabel": {"jpg": jpeg(2)}},
    "bad_label": {"farclass": {"jpg": jpeg(3), "cls": b"99999"}},  # the manifest lists 2 classes
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_sample_is_replaced_and_counted(tmp_path, kind):
    cfg = shards_with(tmp_path, CASES[kind])
    ld = build_loader(LoaderSpec(cfg, "train", 13, 0, 1, seed=0))
    batches = list(ld)
    assert len(batches) == 1 and batches[0].batch_size == 13  # shapes stay fixed
    assert ld.metrics()["data/errors"] == 1 and ld.metrics()[f"data/errors_{kind}"] == 1


def test_truncated_tar_counts_the_lost_samples(tmp_path):
    cfg = shards_with(tmp_path, {})
    data = (tmp_path / "s1.tar").read_bytes()
    (tmp_path / "s1.tar").write_bytes(data[:6000])  # inside the third sample
    ld = build_loader(LoaderSpec(cfg, "train", 12, 0, 1, seed=0))
    assert sum(b.batch_size for b in ld) == 12
    assert ld.metrics()["data/errors_truncated"] >= 1


def test_empty_shard_is_skipped_and_counted(tmp_path):
    good_shards(tmp_path, [6])
    write_tar(tmp_path / "s1.tar", [])
    write_manifest(tmp_path, {"s0.tar": 6, "s1.tar": 0})
    ld = build_loader(LoaderSpec(tiny_cfg(tmp_path), "train", 3, 0, 1, seed=0))
    assert len(list(ld)) == 2 and ld.metrics()["data/empty_shards"] == 1 and ld.metrics()["data/errors"] == 0


def test_past_the_error_budget_the_run_stops_naming_shard_and_key(tmp_path):
    cfg = shards_with(tmp_path, CASES["decode"])
    cfg.error_budget = 0.001
    with pytest.raises(UserError, match=r"s1\.tar key badjpeg"):
        list(build_loader(LoaderSpec(cfg, "train", 13, 0, 1, seed=0)))


def test_errors_are_counted_per_rank(tmp_path):
    cfg = shards_with(tmp_path, CASES["decode"])
    loaders = [build_loader(LoaderSpec(cfg, "train", 12, r, 2, seed=0)) for r in range(2)]
    for ld in loaders:
        list(ld)
    assert sorted(ld.metrics()["data/errors"] for ld in loaders) in ([0, 1], [0, 0])  # the tail may drop it


def test_missing_manifest_or_shard_fails_at_start(tmp_path):
    with pytest.raises(UserError, match="_info.json"):
        build_loader(LoaderSpec(tiny_cfg(tmp_path), "train", 2, 0, 1, seed=0))
    good_shards(tmp_path, [4, 4])
    (tmp_path / "s1.tar").unlink()
    with pytest.raises(UserError, match="s1.tar"):
        build_loader(LoaderSpec(tiny_cfg(tmp_path), "train", 2, 0, 1, seed=0))


def test_a_shard_deleted_during_the_run_counts_as_bad_samples_then_stops_naming_it(tmp_path):
    """Built shards have an .idx, so the loader opens the tar only when it reads a sample."""
    build_shards(imagefolder(make_imagefolder(tmp_path / "src")), tmp_path / "out", shard_size=3, progress=False)
    loader = build_loader(LoaderSpec(tiny_cfg(tmp_path / "out", error_budget=0.001), "train", 3, 0, 1, seed=0))
    (tmp_path / "out" / "shard-000001.tar").unlink()  # after the manifest was checked
    with pytest.raises(UserError, match=r"shard-000001\.tar key .*shard unreadable: No such file"):
        list(loader)


@pytest.mark.parametrize("label", [b"99999", b"-3", b"2"])
def test_a_label_outside_the_manifest_classes_is_a_bad_sample(tmp_path, label):
    """It failed the online probe's loss far from its sample; now it is named and counted like any bad sample."""
    cfg = shards_with(tmp_path, {"odd": {"jpg": jpeg(4), "cls": label}})
    ld = build_loader(LoaderSpec(cfg, "train", 13, 0, 1, seed=0))
    assert all(((b.labels >= 0) & (b.labels < 2)).all() for b in ld)
    assert ld.metrics()["data/errors_bad_label"] == 1


@pytest.mark.parametrize("count", [-100, 2.5, "8", None, True])
def test_a_manifest_count_that_is_not_a_sample_count_fails_at_start(tmp_path, count):
    """A count of -100 silently dropped the shard from the epoch; any count but an integer >= 0 is refused."""
    cfg = shards_with(tmp_path, {})
    manifest = json.loads((tmp_path / "_info.json").read_text())
    manifest["shards"][1]["count"] = count
    (tmp_path / "_info.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"shard s1\.tar: count"):
        build_loader(LoaderSpec(cfg, "train", 4, 0, 1, seed=0))

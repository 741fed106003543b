"""scale/data/shards/verify.py: `scale shards verify` finds damaged tars and member indexes (the loader names a
corrupt index too)."""

import json

import pytest

from scale.data.factory import build_loader
from scale.data.shards.verify import verify
from scale.data.shards.write import build_shards
from scale.data.sources import imagefolder
from scale.data.spec import LoaderSpec
from scale.errors import UserError
from tests.data.helpers import good_shards, jpeg, make_imagefolder, tiny_cfg, write_manifest, write_tar


def test_verify_reports_corruption(tmp_path, capsys):
    src = make_imagefolder(tmp_path / "src")
    build_shards(imagefolder(src), tmp_path / "out", shard_size=10, progress=True)
    assert verify(tmp_path / "out", progress=True) == []
    written = capsys.readouterr().err  # not a terminal: whole progress lines, no `\r` bar updates
    assert "\r" not in written and "verify: " in written and "shards -> " in written
    path = tmp_path / "out" / "shard-000000.tar"
    data = bytearray(path.read_bytes())
    data[700:760] = b"\0" * 60  # inside the first JPEG
    path.write_bytes(bytes(data))
    problems = verify(tmp_path / "out")
    assert any("sha256" in p for p in problems) and any("000000000" in p for p in problems)


@pytest.mark.parametrize("damage", ["{not json", '{"members": [["000000000", {"jpg": 5}]]}', "shifted"])
def test_corrupt_index_is_named_by_verify_and_the_loader(tmp_path, damage):
    src = make_imagefolder(tmp_path / "src")
    build_shards(imagefolder(src), tmp_path / "out", shard_size=10, progress=False)
    idx = tmp_path / "out" / "shard-000000.idx"
    if damage == "shifted":  # valid JSON, wrong offsets: the loader would read other bytes than the tar's
        record = json.loads(idx.read_text())
        record["members"][0][1]["jpg"][0] += 512
        idx.write_text(json.dumps(record))
    else:
        idx.write_text(damage)
    problems = verify(tmp_path / "out", decode=False)
    assert any(str(idx) in p for p in problems), problems
    if damage != "shifted":
        with pytest.raises(UserError, match="shard-000000.idx: corrupt shard index"):
            list(build_loader(LoaderSpec(tiny_cfg(tmp_path / "out", error_budget=0.0), "train", 2, 0, 1, seed=0)))


def test_verify_names_labels_outside_the_classes_and_bad_counts(tmp_path):
    src = make_imagefolder(tmp_path / "src")
    build_shards(imagefolder(src), tmp_path / "out", shard_size=10, progress=False)
    good_shards(tmp_path / "odd", [2])
    write_tar(
        tmp_path / "odd" / "s1.tar",
        [("far", {"jpg": jpeg(1), "cls": b"99999"}), ("neg", {"jpg": jpeg(2), "cls": b"-3"})],
    )
    write_manifest(tmp_path / "odd", {"s0.tar": 2, "s1.tar": 2})
    problems = verify(tmp_path / "odd", decode=False)
    assert [p for p in problems if "bad label" in p] == [
        f"{tmp_path / 'odd' / 's1.tar'}: sample far (class 99999: the manifest lists 2 classes): bad label",
        f"{tmp_path / 'odd' / 's1.tar'}: sample neg (class -3: the manifest lists 2 classes): bad label",
    ], problems
    assert verify(tmp_path / "out", decode=False) == []  # a sound directory's labels pass
    write_manifest(tmp_path / "odd", {"s0.tar": 2, "s1.tar": -100})
    with pytest.raises(UserError, match=r"shard s1\.tar: count -100"):
        verify(tmp_path / "odd", decode=False)

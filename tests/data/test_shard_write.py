"""scale/data/shards/write.py: shards from every source kind, the manifest, the skipped report, resume, and
`scale shards build` (with `verify` on what it wrote)."""

import csv
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from PIL import Image

from scale.cli import main
from scale.data.shards.layout import scan_tar
from scale.data.shards.read import read_manifest
from scale.data.shards.verify import verify
from scale.data.shards.write import build_shards
from scale.data.sources import imagefolder, imagenet22k, openimages
from tests.data.helpers import jpeg, make_imagefolder


def test_imagefolder_build_manifest_and_skipped_report(tmp_path):
    src = make_imagefolder(tmp_path / "src")
    manifest = build_shards(imagefolder(src), tmp_path / "out", shard_size=3, progress=False)
    assert manifest["classes"] == ["cat", "dog"] and manifest["num_samples"] == 7
    # sorted listing: cat/0 1 2 broken | dog/0 1 2 z.png; broken.jpg leaves a hole in shard 1
    assert [s["count"] for s in manifest["shards"]] == [3, 2, 2] and manifest["num_skipped"] == 1
    assert "broken.jpg" in (tmp_path / "out" / "_skipped.tsv").read_text()
    members, error = scan_tar(tmp_path / "out" / "shard-000001.tar")
    assert error is None and [k for k, _ in members] == ["000000004", "000000005"]
    with tarfile.open(tmp_path / "out" / "shard-000001.tar") as tar:
        assert tar.extractfile("000000004.cls").read() == b"1"
        assert json.loads(tar.extractfile("000000004.json").read())["source"].endswith("dog/0.jpg")
        assert tar.extractfile("000000004.jpg").read() == (src / "dog" / "0.jpg").read_bytes()  # original bytes
    assert verify(tmp_path / "out") == []


def test_rerun_skips_complete_shards_and_rebuilds_missing_ones_identically(tmp_path):
    src = make_imagefolder(tmp_path / "src")
    first = build_shards(imagefolder(src), tmp_path / "out", shard_size=3, progress=False)
    kept = (tmp_path / "out" / "shard-000000.tar").stat().st_mtime_ns
    (tmp_path / "out" / "shard-000001.idx").unlink()  # as if killed before the shard was complete
    (tmp_path / "out" / ".shard-000002.tar.tmp-1").write_bytes(b"partial")
    second = build_shards(imagefolder(src), tmp_path / "out", shard_size=3, progress=False)
    assert second["shards"] == first["shards"]  # same checksums: deterministic bytes
    assert (tmp_path / "out" / "shard-000000.tar").stat().st_mtime_ns == kept


def test_max_side_re_encodes_large_images(tmp_path):
    src = make_imagefolder(tmp_path / "src")
    build_shards(imagefolder(src), tmp_path / "out", shard_size=10, max_side=40, progress=False)
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        img = Image.open(io.BytesIO(tar.extractfile("000000000.jpg").read()))
        meta = json.loads(tar.extractfile("000000000.json").read())
    assert img.format == "JPEG" and img.size == (40, 20) and (meta["width"], meta["height"]) == (40, 20)


def test_imagenet22k_synset_tars_and_folders(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with tarfile.open(src / "n002.tar", "w") as tar:
        for i in range(2):
            payload = jpeg(i)
            info = tarfile.TarInfo(f"n002_{i}.JPEG")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    (src / "n001").mkdir()
    (src / "n001" / "a.jpg").write_bytes(jpeg(5))
    source = imagenet22k(src)
    assert source.classes == ["n001", "n002"] and [it.label for it in source.items] == [0, 1, 1]
    manifest = build_shards(source, tmp_path / "out", workers=2, shard_size=2, progress=False)
    assert manifest["num_samples"] == 3 and verify(tmp_path / "out") == []


def test_openimages_multi_label(tmp_path):
    (tmp_path / "img").mkdir()
    for name in ("aa", "bb", "cc"):
        (tmp_path / "img" / f"{name}.jpg").write_bytes(jpeg(len(name)))
    with open(tmp_path / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["ImageID", "Source", "LabelName", "Confidence"])
        writer.writerows([["aa", "h", "/m/2", "1"], ["aa", "h", "/m/1", "1"], ["bb", "h", "/m/3", "0"]])
    source = openimages(tmp_path / "img", str(tmp_path / "labels.csv"))
    assert source.classes == ["/m/1", "/m/2"] and [it.label for it in source.items] == [[0, 1], [], []]
    build_shards(source, tmp_path / "out", progress=False)
    assert read_manifest(tmp_path / "out")["label_kind"] == "multi" and verify(tmp_path / "out") == []


def test_cli_build_and_verify(tmp_path, capsys):
    src = make_imagefolder(tmp_path / "src")
    assert main(["shards", "build", "--source", f"imagefolder:{src}", "--out", str(tmp_path / "out")]) == 0
    assert main(["shards", "verify", str(tmp_path / "out")]) == 0
    assert main(["shards", "build", "--source", "nokind:x", "--out", str(tmp_path / "o")]) == 2
    assert main(["shards", "verify", str(tmp_path / "missing")]) == 2
    assert "_info.json" in capsys.readouterr().err


def test_every_input_file_is_used_or_listed_with_a_reason_and_empty_classes_are_named(tmp_path, capsys):
    src = make_imagefolder(tmp_path / "src")
    Image.new("RGB", (20, 20), "blue").save(src / "cat" / "UPPER.JPEG", "JPEG")
    Image.new("RGB", (20, 20), "blue").save(src / "dog" / "a.gif")
    (src / "cat" / ".DS_Store").write_bytes(b"\0\1")
    (src / "dog" / "notes.txt").write_text("hello")
    (src / "README").write_text("stray")
    (src / "empty").mkdir()
    (src / "only_junk").mkdir()
    (src / "only_junk" / "broken.png").write_bytes(b"junk")
    assert main(["shards", "build", "--source", f"imagefolder:{src}", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "2 class(es) have no sample: empty, only_junk" in out
    manifest = read_manifest(tmp_path / "out")
    assert manifest["empty_classes"] == ["empty", "only_junk"] and manifest["num_samples"] == 9
    rows = dict(line.split("\t") for line in (tmp_path / "out" / "_skipped.tsv").read_text().splitlines())
    assert set(rows) == {
        str(src / n) for n in ("cat/.DS_Store", "dog/notes.txt", "README", "cat/broken.jpg", "only_junk/broken.png")
    }
    assert "hidden" in rows[str(src / "cat/.DS_Store")] and "'.txt'" in rows[str(src / "dog/notes.txt")]
    assert "class folder" in rows[str(src / "README")] and "cannot identify" in rows[str(src / "cat/broken.jpg")]
    assert not any(" at 0x" in reason for reason in rows.values())


def test_a_shards_record_describes_its_writers_own_bytes_when_another_writer_replaces_it_at_once(tmp_path, monkeypatch):
    """Concurrent builds of one directory: another writer may rename its shard over the one this writer has just
    renamed into place. The record (the .idx and the manifest's line) holds the checksum, size and members of the
    bytes this writer wrote, read before its rename, not whatever stands at the name afterwards."""
    rename = os.replace
    mine = {}

    def another_writer_follows(src, dst):
        rename(src, dst)
        if str(dst).endswith(".tar"):
            mine[Path(dst).name] = Path(dst).read_bytes()
            theirs = Path(dst).with_name(".theirs.tmp")
            theirs.write_bytes(b"another writer's shard")
            rename(theirs, dst)

    monkeypatch.setattr(os, "replace", another_writer_follows)
    src = make_imagefolder(tmp_path / "src")
    manifest = build_shards(imagefolder(src), tmp_path / "out", shard_size=3, progress=False)
    assert sorted(mine) == [s["name"] for s in manifest["shards"]]
    for shard in manifest["shards"]:
        own = mine[shard["name"]]
        assert shard["sha256"] == hashlib.sha256(own).hexdigest() and shard["bytes"] == len(own)
        record = json.loads((tmp_path / "out" / shard["index"]).read_text())
        assert record["sha256"] == shard["sha256"] and len(record["members"]) == shard["count"]

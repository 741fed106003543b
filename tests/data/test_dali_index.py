"""scale/data/dali/index.py: DALI's index files (written without DALI): the format of DALI's own tool, rewritten when
stale, written to a temporary directory when the shard directory is read-only, none for an empty shard."""

import os

import pytest

from scale.data.dali import index as dali_index
from scale.data.dali.index import dali_index_paths, write_dali_indexes
from scale.data.shards.read import read_manifest
from scale.data.shards.write import build_shards
from scale.data.sources import imagefolder
from tests.data.helpers import good_shards, make_imagefolder


def test_index_is_the_one_dalis_own_tool_writes(embedded_data, tmp_path):
    wds2idx = pytest.importorskip("wds2idx")
    photos = embedded_data / "embedded" / "photos" / "train"
    ours = write_dali_indexes(photos)[0]
    theirs = tmp_path / "theirs.idx"
    with wds2idx.IndexCreator(str(photos / "shard-000000.tar"), str(theirs), verbose=False) as creator:
        creator.create_index()
    assert ours.read_text() == theirs.read_text()


def test_build_writes_one_index_per_shard_whose_offsets_read_its_members(tmp_path):
    build_shards(imagefolder(make_imagefolder(tmp_path / "src")), tmp_path / "out", shard_size=3, progress=False)
    paths = write_dali_indexes(tmp_path / "out")
    assert [p.name for p in paths] == [f"shard-00000{n}.dali-idx" for n in range(3)]
    header, *rows = paths[0].read_text().splitlines()
    assert header == "v1.2 3" and len(rows) == 3
    data = (tmp_path / "out" / "shard-000000.tar").read_bytes()
    ext, offset, size, name = rows[0].split()[:4]
    assert (ext, name) == ("jpg", "000000000.jpg")
    assert data[int(offset) : int(offset) + int(size)] == (tmp_path / "src" / "cat" / "0.jpg").read_bytes()


def test_a_stale_index_is_rewritten_and_a_fresh_one_kept(tmp_path):
    good_shards(tmp_path, [2, 3])
    first, second = write_dali_indexes(tmp_path)
    first.write_text("stale")
    os.utime(first, (0, 0))  # older than its tar
    second.write_text("kept")
    write_dali_indexes(tmp_path)
    assert first.read_text().startswith("v1.2 2\n") and second.read_text() == "kept"


def test_a_read_only_shard_directory_gets_its_indexes_in_a_temporary_directory(tmp_path, monkeypatch):
    good_shards(tmp_path, [2, 0, 3])
    write = dali_index.write_atomic

    def read_only(path, text, **how):
        if path.parent == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        write(path, text, **how)

    monkeypatch.setattr(dali_index, "write_atomic", read_only)
    paths = dali_index_paths(tmp_path, read_manifest(tmp_path))
    assert [p.name for p in paths] == ["s0.dali-idx", "s2.dali-idx"]  # none for the empty shard
    assert all(p.parent != tmp_path and p.read_text().startswith("v1.2 ") for p in paths)
    assert not list(tmp_path.glob("*.dali-idx"))

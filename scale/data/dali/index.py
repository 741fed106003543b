"""DALI's index files, for `fn.readers.webdataset` (data.backend=dali), written from the shards' own member index:
plain text, so writing them needs no DALI.

DALI's format (its wds2idx tool): a line `v1.2 N`, then one line per sample with `ext offset size name` for each
member. The file is `shard-NNNNNN.dali-idx` beside `shard-NNNNNN.tar` (`.idx` is the shards' own JSON index). It is
written by `scale shards build` and `scale shards dali-index DIR`; a loader finding it missing or older than its
tar writes it again, into a temporary directory when the shard directory is read-only.
"""

import tempfile
from pathlib import Path

from scale.data.shards.read import read_index, read_manifest
from scale.nofollow import write_atomic


def dali_index_name(tar_name: str) -> str:
    return f"{tar_name.removesuffix('.tar')}.dali-idx"


def dali_index_text(members: list) -> str:
    lines = [f"v1.2 {len(members)}"]
    for key, exts in members:
        lines.append(" ".join(f"{ext} {offset} {size} {key}.{ext}" for ext, (offset, size) in exts.items()))
    return "\n".join(lines) + "\n"


def _fresh(index: Path, tar: Path) -> bool:
    return index.is_file() and index.stat().st_mtime >= tar.stat().st_mtime


def write_dali_indexes(shard_dir, manifest: dict = None, out_dir=None) -> list[Path]:
    """Write the DALI index of every non-empty shard whose index is missing or stale; their paths, in manifest
    order. out_dir defaults to the shard directory."""
    shard_dir = Path(shard_dir)
    manifest = manifest or read_manifest(shard_dir)
    out_dir = Path(out_dir or shard_dir)
    paths = []
    for shard in manifest["shards"]:
        if int(shard["count"]) == 0:
            continue
        tar, index = shard_dir / shard["name"], out_dir / dali_index_name(shard["name"])
        if not _fresh(index, tar):
            members, _ = read_index(shard_dir, shard)  # a truncated tar keeps its readable samples
            write_atomic(index, dali_index_text(members), concurrent=True)  # every rank's loader may, at once
        paths.append(index)
    return paths


def dali_index_paths(shard_dir, manifest: dict) -> list[Path]:
    """The DALI indexes of a shard directory, written where missing: beside the shards, or in a temporary
    directory when the shard directory is not writable."""
    try:
        return write_dali_indexes(shard_dir, manifest)
    except OSError:  # read-only file system or no permission
        return write_dali_indexes(shard_dir, manifest, tempfile.mkdtemp(prefix="scale-dali-idx-"))

"""Writing shards from a source (`scale shards build`); the format is described in scale/data/shards/__init__.py.

Writing is atomic and resumable: a shard is written to a hidden temporary name and renamed when complete; its index
is written (also by rename) after that, and a rerun skips every shard whose index exists and matches the same items
and options.
"""

import hashlib
import io
import json
import logging
import tarfile
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from scale.data.dali.index import write_dali_indexes
from scale.data.shards.jpeg import BadImage, prepare_jpeg
from scale.data.shards.layout import (
    FORMAT,
    LABEL_KINDS,
    MANIFEST,
    SKIPPED_REPORT,
    index_name,
    scan_tar,
    sha256_file,
    shard_name,
)
from scale.errors import UserError
from scale.nofollow import replacing, write_atomic
from scale.progress import progress_bar
from scale.readback import SHARD_BUILT, BadFile, read_json

log = logging.getLogger(__name__)

TAR_MTIME = 0  # fixed member mtime: the same items and options give byte-identical shards


@dataclass(frozen=True)
class Item:
    """One source image: `ref` names it (a path, or TAR!MEMBER); `data` holds its bytes when they are not on disk."""

    ref: str
    label: object = None  # int (single), list[int] (multi), None (unlabeled)
    data: bytes | None = None


@dataclass
class Source:
    description: str
    label_kind: str
    classes: list
    items: list
    ignored: list = field(default_factory=list)  # (ref, reason): input files that are not images to use


_open_tars: dict = {}


def read_item_bytes(item: Item) -> bytes:
    if item.data is not None:
        return item.data
    if "!" in item.ref:  # a member of a per-synset tar (ImageNet-22K release)
        tar_path, member = item.ref.split("!", 1)
        if tar_path not in _open_tars:
            _open_tars.clear()  # items are sorted by tar, so one open tar per worker is enough
            _open_tars[tar_path] = tarfile.open(tar_path)
        f = _open_tars[tar_path].extractfile(member)
        if f is None:
            raise BadImage("tar member is not a regular file")
        return f.read()
    return Path(item.ref).read_bytes()


def encode_label(label, label_kind: str) -> dict:
    if label_kind == "single":
        return {"cls": str(int(label)).encode()}
    if label_kind == "multi":
        return {"labels": json.dumps(sorted(int(x) for x in label)).encode()}
    return {}


# ---------------------------------------------------------------------------------------------------- writing shards


def _items_digest(items: list, options: dict) -> str:
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for item in items:
        digest.update(f"{item.ref}\t{item.label}\n".encode())
    return digest.hexdigest()


def _built(idx_path: Path) -> dict | None:
    """What a shard built before recorded in its .idx, or None: none, or a damaged one (the shard is built again)."""
    try:
        return read_json(idx_path, SHARD_BUILT)
    except FileNotFoundError:
        return None
    except (OSError, BadFile) as err:
        log.warning("%s; building that shard again", err)
        return None


def _write_shard(job: tuple) -> dict:
    out_dir, index, items, label_kind, options = job
    out_dir = Path(out_dir)
    final, idx_path = out_dir / shard_name(index), out_dir / index_name(index)
    digest = _items_digest(items, options)
    record = _built(idx_path) if final.exists() else None
    if record is not None:
        if record["digest"] != digest:
            raise UserError(
                f"{idx_path}: this shard was built from other items or options; build into a new "
                f"--out directory (or delete {out_dir})"
            )
        return record
    with replacing(final, binary=True, concurrent=True) as stream:
        count, skipped = _write_tar(stream, items, label_kind, options)
        stream.flush()
        # the record describes this writer's bytes, read before the rename: once renamed, `final` may already be
        # another writer's (concurrent builds of one directory)
        written = stream.temporary
        members, error = scan_tar(written)
        assert error is None, f"{final}: {error}"  # we just wrote it
        sha256, size = sha256_file(written), written.stat().st_size
    record = {
        "name": final.name,
        "count": count,
        "sha256": sha256,
        "bytes": size,
        "digest": digest,
        "skipped": skipped,
        "members": members,
    }
    write_atomic(idx_path, json.dumps(record), concurrent=True)
    return record


def _write_tar(stream, items: list, label_kind: str, options: dict) -> tuple[int, list]:
    """The items' samples as a tar into `stream`; returns how many, and the items skipped with why."""
    skipped = []
    count = 0
    with tarfile.open(fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for item in items:
            key = item.key
            try:
                jpeg, width, height = prepare_jpeg(read_item_bytes(item), options["max_side"], options["quality"])
            except (BadImage, OSError, KeyError) as err:
                skipped.append([item.ref, str(err).replace("\t", " ").replace("\n", " ")])
                continue
            members = {
                "jpg": jpeg,
                **encode_label(item.label, label_kind),
                "json": json.dumps({"source": item.ref, "width": width, "height": height}).encode(),
            }
            for ext, payload in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(payload), TAR_MTIME, 0o444
                tar.addfile(info, io.BytesIO(payload))
            count += 1
    return count, skipped


@dataclass(frozen=True)
class _KeyedItem(Item):
    key: str = ""


def build_shards(
    source: Source,
    out_dir,
    shard_size: int = 1000,
    max_side: int | None = None,
    workers: int = 1,
    quality: int = 90,
    progress: bool = True,
) -> dict:
    """Write `source` as shards into out_dir (resuming a partial build) and return the manifest."""
    if source.label_kind not in LABEL_KINDS:
        raise ValueError(f"label_kind must be one of {LABEL_KINDS}")
    if shard_size < 1:
        raise UserError(f"--shard-size must be >= 1, got {shard_size}")
    if not source.items:
        raise UserError(f"{source.description}: no images found")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = {"shard_size": shard_size, "max_side": max_side, "quality": quality}
    items = [_KeyedItem(it.ref, it.label, it.data, key=f"{i:09d}") for i, it in enumerate(source.items)]
    jobs = [
        (str(out_dir), n, items[start : start + shard_size], source.label_kind, options)
        for n, start in enumerate(range(0, len(items), shard_size))
    ]
    records = []
    bar = progress_bar(len(items), enabled=progress, desc=f"shards -> {out_dir}", unit="img")
    if workers > 1:
        with get_context("spawn").Pool(workers) as pool:
            for job, record in zip(jobs, pool.imap(_write_shard, jobs)):
                records.append(record)
                bar.update(len(job[2]))
    else:
        for job in jobs:
            records.append(_write_shard(job))
            bar.update(len(job[2]))
    bar.close()
    skipped = [list(row) for row in source.ignored] + [row for r in records for row in r["skipped"]]
    write_atomic(out_dir / SKIPPED_REPORT, "".join(f"{ref}\t{reason}\n" for ref, reason in skipped))
    manifest = {
        "format": FORMAT,
        "source": source.description,
        "label_kind": source.label_kind,
        "classes": list(source.classes),
        "num_samples": sum(r["count"] for r in records),
        "num_skipped": len(skipped),
        "empty_classes": _empty_classes(source, skipped),
        "options": options,
        "skipped_report": SKIPPED_REPORT,
        "shards": [
            {"name": r["name"], "count": r["count"], "sha256": r["sha256"], "bytes": r["bytes"], "index": index_name(n)}
            for n, r in enumerate(records)
        ],
    }
    write_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=1), concurrent=True)
    write_dali_indexes(out_dir, manifest)  # DALI's reader index (plain text; needs no DALI)
    return manifest


def _empty_classes(source: Source, skipped: list) -> list:
    """Names of the classes no written sample carries (a class folder with no usable image)."""
    if source.label_kind == "none":
        return []
    dropped = {ref for ref, _ in skipped}
    used = set()
    for item in source.items:
        if item.ref not in dropped:
            used.update(item.label if isinstance(item.label, list) else [item.label])
    return [name for i, name in enumerate(source.classes) if i not in used]

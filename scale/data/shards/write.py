"""WebDataset shards: write them from a source, read their manifest and index, verify them.

A shard directory holds `shard-NNNNNN.tar` files, one `shard-NNNNNN.idx` per tar (member offsets, so a loader can
read any sample by its position; it is also the marker that the shard is complete), one `shard-NNNNNN.dali-idx` (the
same offsets in the format of DALI's webdataset reader, written at the end of this module) and the manifest `_info.json`:

    {"format": "scale-shards-1", "source": "...", "label_kind": "single" | "multi" | "none",
     "classes": [names...], "num_samples": N, "num_skipped": K, "empty_classes": [names...], "options": {...},
     "shards": [{"name": "shard-000000.tar", "count": n, "sha256": "...", "bytes": b, "index": "shard-000000.idx"}],
     "skipped_report": "_skipped.tsv"}

Each sample is `KEY.jpg` (JPEG bytes), `KEY.cls` (class index as text; single-label), or `KEY.labels` (JSON list of
class indices; multi-label), and `KEY.json` ({"source": path, "width": w, "height": h}). Keys are the 9-digit position
of the item in the sorted source listing, so key order is deterministic and stable across reruns.

Writing is atomic and resumable: a shard is written to a hidden temporary name and renamed when complete; its index
is written (also by rename) after that, and a rerun skips every shard whose index exists and matches the same items
and options.
"""

import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from scale.errors import UserError

FORMAT = "scale-shards-1"
MANIFEST = "_info.json"
SKIPPED_REPORT = "_skipped.tsv"
LABEL_KINDS = ("single", "multi", "none")
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


class BadImage(Exception):
    """A source image that cannot be used; the message is the reason written to the skipped report."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def index_name(index: int) -> str:
    return f"shard-{index:06d}.idx"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------------- reading sources

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


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB, scaled rather than clipped: 16-bit and 32-bit integer images by their range (convert("RGB")
    clips every value above 255 to white), float images from [0, 1] (else their own min..max); transparent pixels
    (RGBA, LA, PA, palette with transparency) composited on white instead of showing the colour stored beneath."""
    if img.mode.startswith("I;16") or img.mode == "I":
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or values.max() <= 65535 else values.max()
        return Image.fromarray(np.clip(values / top * 255.0 + 0.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "F":
        values = np.nan_to_num(np.asarray(img, dtype=np.float64))
        low, high = (0.0, 1.0) if values.min() >= 0 and values.max() <= 1 else (values.min(), values.max())
        values = (values - low) / max(high - low, 1e-12) * 255.0 + 0.5
        return Image.fromarray(np.clip(values, 0, 255).astype(np.uint8), "L").convert("RGB")
    if img.mode == "P" and "transparency" in img.info or img.mode in ("PA", "LA", "La", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        white = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, img).convert("RGB")
    return img.convert("RGB")


def prepare_jpeg(data: bytes, max_side: int | None, quality: int) -> tuple[bytes, int, int]:
    """JPEG bytes to store: the original bytes when they are an RGB/L JPEG within max_side, else a re-encode.

    Raises BadImage when the bytes do not decode completely.
    """
    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        too_big = bool(max_side) and max(width, height) > max_side
        if img.format == "JPEG" and img.mode in ("RGB", "L") and not too_big:
            img.draft(img.mode, (max(1, width // 8), max(1, height // 8)))  # reads every coefficient, decodes 1/8
            img.load()
            return data, width, height
        img.load()
        img = to_rgb(img)
        if too_big:
            scale = max_side / max(width, height)
            img = img.resize(
                (max(1, round(width * scale)), max(1, round(height * scale))), Image.BICUBIC, reducing_gap=3.0
            )
        out = io.BytesIO()
        img.save(out, "JPEG", quality=quality)
        return out.getvalue(), img.width, img.height
    except BadImage:
        raise
    except Exception as err:  # PIL raises many types (OSError, SyntaxError, ValueError, DecompressionBombError)
        message = re.sub(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>", "", str(err))  # PIL names its BytesIO by address
        raise BadImage(f"{type(err).__name__}: {message}") from None


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


def scan_tar(path: Path) -> tuple[list, str | None]:
    """[(key, {ext: [offset, size]})] in member order, and an error text when the tar ends early or is unreadable."""
    samples: list = []
    by_key: dict = {}
    try:
        with tarfile.open(path) as tar:
            for info in tar:
                if not info.isfile():
                    continue
                base = os.path.basename(info.name)
                if "." not in base:
                    continue
                key, ext = base.split(".", 1)
                key = os.path.join(os.path.dirname(info.name), key)
                if key not in by_key:
                    by_key[key] = {}
                    samples.append((key, by_key[key]))
                by_key[key][ext] = [info.offset_data, info.size]
        size = path.stat().st_size
        if any(off + n > size for _, m in samples for off, n in m.values()):
            return samples, "tar is truncated"
        return samples, None
    except (tarfile.TarError, OSError, EOFError) as err:
        return samples, f"tar unreadable: {err}"


def _write_shard(job: tuple) -> dict:
    out_dir, index, items, label_kind, options = job
    out_dir = Path(out_dir)
    final, idx_path = out_dir / shard_name(index), out_dir / index_name(index)
    digest = _items_digest(items, options)
    if idx_path.exists() and final.exists():
        record = json.loads(idx_path.read_text())
        if record.get("digest") != digest:
            raise UserError(
                f"{idx_path}: this shard was built from other items or options; build into a new "
                f"--out directory (or delete {out_dir})"
            )
        return record
    tmp = out_dir / f".{final.name}.tmp-{os.getpid()}"
    skipped = []
    count = 0
    with open(tmp, "wb") as stream, tarfile.open(fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT) as tar:
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
    members, error = scan_tar(tmp)
    assert error is None, f"{tmp}: {error}"  # we just wrote it
    record = {
        "name": final.name,
        "count": count,
        "sha256": sha256_file(tmp),
        "bytes": tmp.stat().st_size,
        "digest": digest,
        "skipped": skipped,
        "members": members,
    }
    os.replace(tmp, final)
    _atomic_write_text(idx_path, json.dumps(record))
    return record


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
    bar = tqdm(total=len(items), unit="img", desc=f"shards -> {out_dir}", disable=not progress)
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
    _atomic_write_text(out_dir / SKIPPED_REPORT, "".join(f"{ref}\t{reason}\n" for ref, reason in skipped))
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
    _atomic_write_text(out_dir / MANIFEST, json.dumps(manifest, indent=1))
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


# ---------------------------------------------------------------------------------------------------- reading shards


def read_manifest(shard_dir) -> dict:
    """The manifest of a shard directory; fails naming the path when it or one of its shards is missing."""
    path = Path(shard_dir) / MANIFEST
    if not path.is_file():
        raise UserError(f"shard manifest not found: {path} (build shards with `scale shards build`)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not valid JSON: {err}") from None
    for key in ("label_kind", "classes", "shards"):
        if key not in manifest:
            raise UserError(f"{path}: missing key '{key}'")
    for shard in manifest["shards"]:
        if not (Path(shard_dir) / shard["name"]).is_file():
            raise UserError(f"shard listed in {path} not found: {Path(shard_dir) / shard['name']}")
    return manifest


def read_index(shard_dir, shard: dict) -> tuple[list, str | None]:
    """Member offsets of one shard: from its .idx file, else by scanning the tar (shards made by other tools)."""
    idx = Path(shard_dir) / shard.get("index", "")
    if shard.get("index") and idx.is_file():
        try:
            members = [(str(key), dict(exts)) for key, exts in json.loads(idx.read_text())["members"]]
            for _key, exts in members:
                if not all(isinstance(span, list) and len(span) == 2 for span in exts.values()):
                    raise ValueError("a member's offsets are not [offset, size]")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
            raise UserError(
                f"{idx}: corrupt shard index ({type(err).__name__}: {err}); delete it and rebuild the shards "
                f"with `scale shards build`"
            ) from None
        return members, None
    return scan_tar(Path(shard_dir) / shard["name"])


def verify(shard_dir, decode: bool = True, progress: bool = False) -> list[str]:
    """Problems found in a shard directory (empty when it is sound): counts, checksums, labels, decodable images."""
    shard_dir = Path(shard_dir)
    manifest = read_manifest(shard_dir)
    problems = []
    total = 0
    needs_label = {"single": "cls", "multi": "labels"}.get(manifest["label_kind"])
    for shard in tqdm(manifest["shards"], unit="shard", disable=not progress):
        path = shard_dir / shard["name"]
        if shard.get("sha256") and sha256_file(path) != shard["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest")
        members, error = scan_tar(path)
        if error:
            problems.append(f"{path}: {error}")
        problems += _check_index(shard_dir, shard, members)
        if len(members) != shard["count"]:
            problems.append(f"{path}: {len(members)} samples, manifest says {shard['count']}")
        total += len(members)
        with open(path, "rb") as f:
            for key, exts in members:
                problems += _check_sample(f, path, key, exts, needs_label, decode)
    if manifest.get("num_samples") is not None and total != manifest["num_samples"]:
        problems.append(f"{shard_dir / MANIFEST}: num_samples {manifest['num_samples']}, shards hold {total}")
    return problems


def _check_index(shard_dir: Path, shard: dict, members: list) -> list[str]:
    """The shard's .idx (what the loader reads) must list the members the tar holds, at their offsets."""
    if not shard.get("index") or not (shard_dir / shard["index"]).is_file():
        return []
    try:
        indexed, _ = read_index(shard_dir, shard)
    except UserError as err:
        return [str(err)]
    if indexed != [(key, {ext: list(span) for ext, span in exts.items()}) for key, exts in members]:
        return [f"{shard_dir / shard['index']}: does not match the members of {shard['name']}"]
    return []


def _check_sample(f, path, key, exts, needs_label, decode) -> list[str]:
    if "jpg" not in exts:
        return [f"{path}: sample {key} has no .jpg member"]
    if needs_label and needs_label not in exts:
        return [f"{path}: sample {key} has no .{needs_label} member"]
    if decode:
        offset, size = exts["jpg"]
        f.seek(offset)
        try:
            prepare_jpeg(f.read(size), None, 90)
        except BadImage as err:
            return [f"{path}: sample {key}: image does not decode ({err})"]
    return []


# ------------------------------------------------------------------------------------------- DALI's index files
# For `fn.readers.webdataset` (data.backend=dali), written from the shards' own member index (no DALI needed).
# DALI's format (its wds2idx tool): a line `v1.2 N`, then one line per sample with `ext offset size name` for each
# member. The file is `shard-NNNNNN.dali-idx` beside `shard-NNNNNN.tar` (`.idx` is the shards' own JSON index). It is
# written by `scale shards build` and `scale shards dali-index DIR`; a loader finding it missing or older than its
# tar writes it again, into a temporary directory when the shard directory is read-only.


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
            tmp = index.with_name(f".{index.name}.tmp-{os.getpid()}")
            tmp.write_text(dali_index_text(members))
            os.replace(tmp, index)
        paths.append(index)
    return paths


def dali_index_paths(shard_dir, manifest: dict) -> list[Path]:
    """The DALI indexes of a shard directory, written where missing: beside the shards, or in a temporary
    directory when the shard directory is not writable."""
    try:
        return write_dali_indexes(shard_dir, manifest)
    except OSError:  # read-only file system or no permission
        return write_dali_indexes(shard_dir, manifest, tempfile.mkdtemp(prefix="scale-dali-idx-"))

"""`scale shards verify`: every shard against the manifest (counts, checksums, member index, labels, decodable
images)."""

from pathlib import Path

from scale.data.loader import SampleError, parse_label
from scale.data.shards.jpeg import BadImage, prepare_jpeg
from scale.data.shards.layout import MANIFEST, scan_tar, sha256_file
from scale.data.shards.read import read_index, read_manifest
from scale.errors import UserError
from scale.progress import progress_bar


def verify(shard_dir, decode: bool = True, progress: bool = False) -> list[str]:
    """Problems found in a shard directory (empty when it is sound): counts, checksums, labels, decodable images."""
    shard_dir = Path(shard_dir)
    manifest = read_manifest(shard_dir)
    problems = []
    total = 0
    needs_label = {"single": "cls", "multi": "labels"}.get(manifest["label_kind"])
    labels = (manifest["label_kind"], len(manifest["classes"]))
    shards = manifest["shards"]
    for shard in progress_bar(len(shards), enabled=progress, desc="verify", iterable=shards, unit="shard"):
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
                problems += _check_sample(f, path, key, exts, needs_label, labels, decode)
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


def _read(f, span) -> bytes:
    f.seek(span[0])
    return f.read(span[1])


def _check_sample(f, path, key, exts, needs_label, labels, decode) -> list[str]:
    if "jpg" not in exts:
        return [f"{path}: sample {key} has no .jpg member"]
    if needs_label and needs_label not in exts:
        return [f"{path}: sample {key} has no .{needs_label} member"]
    if needs_label:  # what the loader reads: a number (or list of them) of one of the manifest's classes
        try:
            parse_label(_read(f, exts[needs_label]), labels[0], f"{path}: sample {key}", labels[1])
        except SampleError as err:
            return [f"{err.where}: {err.kind.replace('_', ' ')}"]
    if decode:
        try:
            prepare_jpeg(_read(f, exts["jpg"]), None, 90)
        except BadImage as err:
            return [f"{path}: sample {key}: image does not decode ({err})"]
    return []

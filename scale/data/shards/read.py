"""Reading a shard directory: its manifest and each shard's member index (what the loaders and the verifier read)."""

from pathlib import Path

from scale.data.shards.layout import MANIFEST, scan_tar
from scale.errors import UserError
from scale.readback import SHARD_INDEX, SHARD_MANIFEST, BadFile, read_json


def read_manifest(shard_dir) -> dict:
    """The manifest of a shard directory; fails naming the path when it or one of its shards is missing."""
    path = Path(shard_dir) / MANIFEST
    if not path.is_file():
        raise UserError(f"shard manifest not found: {path} (build shards with `scale shards build`)")
    try:
        manifest = read_json(path, SHARD_MANIFEST)  # BadFile (exit 2) names the field of a damaged one
    except OSError as err:
        raise UserError(f"{path}: cannot read it ({err.strerror or err})") from None
    for number, shard in enumerate(manifest["shards"]):
        _check_shard_entry(path, number, shard)
        if not (Path(shard_dir) / shard["name"]).is_file():
            raise UserError(f"shard listed in {path} not found: {Path(shard_dir) / shard['name']}")
    return manifest


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_shard_entry(path: Path, number: int, shard) -> None:
    """One entry of the manifest's `shards`: a name and a sample count (a negative one silently dropped the shard
    from the epoch order, a fractional one failed far from here)."""
    if not _is_count(shard.get("count")):
        raise UserError(
            f"{path}: shard {shard['name']}: count {shard.get('count')!r} is not a number of samples (an integer "
            "of 0 or more); rebuild the shards with `scale shards build`, or correct the manifest"
        )


def read_index(shard_dir, shard: dict) -> tuple[list, str | None]:
    """Member offsets of one shard: from its .idx file, else by scanning the tar (shards made by other tools)."""
    idx = Path(shard_dir) / shard.get("index", "")
    if shard.get("index") and idx.is_file():
        try:
            members = [(str(key), exts) for key, exts in read_json(idx, SHARD_INDEX)["members"]]
        except (OSError, BadFile) as err:
            problem = err.detail if isinstance(err, BadFile) else err.strerror or err
            raise UserError(
                f"{idx}: corrupt shard index ({problem}); delete it and rebuild the shards with `scale shards build`"
            ) from None
        return members, None
    return scan_tar(Path(shard_dir) / shard["name"])

"""What the files of a shard directory are called, and what writer, reader and verifier share to read them: the
tar scan that locates each member, the checksum. (Their atomic write, where a reader never sees half a file, is
scale.nofollow's.)"""

import hashlib
import os
import tarfile
from pathlib import Path

FORMAT = "scale-shards-1"
MANIFEST = "_info.json"
SKIPPED_REPORT = "_skipped.tsv"
LABEL_KINDS = ("single", "multi", "none")


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

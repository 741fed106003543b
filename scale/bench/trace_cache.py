"""The step trace of a recipe, cached on disk: `scale plan` and `scale submit`'s verdict read the numbers of a
fake-tensor trace (scale.bench.trace, torch and timm: seconds) that depend only on the recipe as the trace runs it
(scale.bench.steptrace.trace_config) and on the code that counts them. A hit imports no torch.

Key: SHA-256 of the trace's config (every section it reads: data, model, method, optim, engine, train; not meta,
eval or sources), of scale's own source files (a changed model, method or counting rule misses) and of the
installed torch and timm versions. Files: $XDG_CACHE_HOME/scale/traces/<key>.json (default ~/.cache/scale),
JSON only (never unpickled), written atomically (a temporary file renamed over the entry), read through a
validating reader: a damaged or wrong-shaped file is ignored and traced again, never a traceback. An unwritable
cache is no error: the trace is used and not kept.

Bounded as ccache bounds its cache: least recently used first. A hit touches its entry's mtime and every write
removes the entries beyond MAX_ENTRIES, oldest mtime first, and the temporary files a killed writer left. Bounding
matters because every change to scale's source starts a new set of keys: the old entries are never hit again."""

import dataclasses
import functools
import hashlib
import json
import os
import time
from importlib import metadata
from pathlib import Path

from omegaconf import OmegaConf

from scale.bench.steptrace import BlockCall, StepTrace, trace_config
from scale.nofollow import write_atomic

FORMAT = 1  # bump when StepTrace's fields change meaning (a changed source file misses anyway)
TRACED_SECTIONS = ("data", "model", "method", "optim", "engine", "train")
PACKAGE = Path(__file__).resolve().parents[1]  # scale/
MAX_ENTRIES = 256  # a few KB each (a ViT-S/16 DINO trace: 2.2 KB, 65 bytes per block call): a few MB at most
LEFT_BEHIND_S = 3600  # a temporary file this old is no write at work (one takes milliseconds) but a killed one's


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/scale/traces, default ~/.cache/scale/traces (the XDG base directory convention)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "scale" / "traces"


def entry_path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


@functools.cache
def code_digest() -> str:
    """What besides the config decides a trace: scale's source files (the models, methods, losses and the counting
    code they run; all of them, as an import graph cannot see registry lookups) and torch's and timm's versions."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    for package in ("torch", "timm"):
        try:
            digest.update(f"{package}=={metadata.version(package)}\0".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{package} absent\0".encode())
    return digest.hexdigest()


def trace_key(cfg) -> str:
    """The cache key of recipe `cfg`'s trace (one image batch per rank, one rank: what the planner traces)."""
    traced = OmegaConf.to_container(trace_config(cfg), resolve=True)
    sections = {name: traced.get(name) for name in TRACED_SECTIONS}
    text = json.dumps({"format": FORMAT, "code": code_digest(), "config": sections}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _is_count(value) -> bool:
    return type(value) is int and value >= 0


def from_json(data) -> StepTrace | None:
    """The StepTrace a cache entry holds; None unless it has exactly StepTrace's fields, counts for numbers."""
    fields = {f.name for f in dataclasses.fields(StepTrace)}
    block_fields = {f.name for f in dataclasses.fields(BlockCall)}
    if not isinstance(data, dict) or set(data) != fields or not isinstance(data["blocks"], list):
        return None
    if not all(_is_count(v) for k, v in data.items() if k != "blocks") or data["images"] < 1:
        return None
    blocks = data["blocks"]
    if not all(isinstance(b, dict) and set(b) == block_fields and all(map(_is_count, b.values())) for b in blocks):
        return None
    return StepTrace(**{**data, "blocks": [BlockCall(**b) for b in blocks]})


def read(key: str) -> StepTrace | None:
    """The cached trace of `key`, or None: absent, unreadable, not JSON, another key or the wrong shape."""
    try:
        entry = json.loads(entry_path(key).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None
    return from_json(entry.get("trace"))


def write(key: str, trace: StepTrace) -> None:
    """Keep `trace` under `key`: a temporary file in the cache directory renamed over the entry, so that a reader
    (another `scale submit` at the same moment) sees the old entry or the new one, never half of one; then prune."""
    path = entry_path(key)
    entry = {"format": FORMAT, "key": key, "trace": dataclasses.asdict(trace)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(entry), concurrent=True)
        prune(path.parent)
    except OSError:  # a read-only or full cache (or a link planted there): the trace is used, not kept
        pass


def prune(folder: Path) -> None:
    """Remove the least recently used entries beyond MAX_ENTRIES and what killed writers left. Several processes may
    prune at once: a file another one removed first is no error."""
    entries, now = [], time.time()
    for path in folder.iterdir():
        try:
            mtime = path.lstat().st_mtime
        except FileNotFoundError:
            continue
        if path.name.endswith(".tmp") and now - mtime > LEFT_BEHIND_S:
            path.unlink(missing_ok=True)
        elif path.suffix == ".json":
            entries.append((mtime, path))
    entries.sort()
    for _, path in entries[: max(0, len(entries) - MAX_ENTRIES)]:
        path.unlink(missing_ok=True)


def touch(key: str) -> None:
    """Mark `key`'s entry as just used (its mtime), so that pruning keeps it; a read-only cache keeps the old time."""
    try:
        os.utime(entry_path(key))
    except OSError:
        pass


def cached_trace(cfg) -> tuple[StepTrace, bool]:
    """(recipe `cfg`'s step trace, whether it came from the cache). A miss traces (imports torch) and keeps it."""
    key = trace_key(cfg)
    trace = read(key)
    if trace is not None:
        touch(key)
        return trace, True
    from scale.bench.trace import trace_step  # torch, timm: only on a miss

    trace = trace_step(cfg)
    write(key, trace)
    return trace, False

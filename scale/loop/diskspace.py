"""A full disk is a clear stop, not a rank's traceback: before each checkpoint (and at start-up, for a run that
has saved one) the free space of the run directory is compared with the size of the last checkpoint
(checkpoints/saves.jsonl). When it is short, the run stops before writing anything (exit 2, one message naming the
run directory, the space needed and the newest intact checkpoint, which stays loadable); a start-up with too little
space is refused the same way. A fresh run has no size to compare with: its first checkpoint is not checked."""

import json
import shutil
from pathlib import Path

import torch.distributed as dist

from scale.checkpoint.store import CheckpointStore
from scale.errors import ConfigError
from scale.faults import active


def expected_bytes(checkpoints: Path) -> int | None:
    """The size of the last sealed checkpoint, which the next one will match; None before the first."""
    try:
        lines = (checkpoints / "saves.jsonl").read_text().splitlines()
        return int(json.loads(lines[-1])["bytes"]) if lines else None
    except (OSError, ValueError, KeyError, IndexError):
        return None


def free_bytes(path: Path, step: int) -> int:
    return 0 if active("disk_full", step) else shutil.disk_usage(path).free


def shortage(checkpoints: Path, root: Path, step: int) -> str | None:
    """Why the next checkpoint does not fit, or None."""
    need = expected_bytes(checkpoints)
    if need is None:
        return None
    free = free_bytes(checkpoints, step)
    if free >= need:
        return None
    found = CheckpointStore(checkpoints).candidates()
    newest = str(found[0]) if found else "none"
    return (
        f"run directory {root}: disk full: the next checkpoint needs about {_size(need)} (the last one's size), "
        f"{_size(free)} is free. The newest intact checkpoint is {newest}; free some space (or lower "
        f"train.keep_last) and run the same command again to continue from it"
    )


def check_start(checkpoints: Path, root: Path) -> None:
    """At start-up, before any rank starts: refuse when the next checkpoint cannot fit."""
    problem = shortage(checkpoints, root, 0)
    if problem:
        raise ConfigError(problem)


def check_before_save(checkpoints: Path, root: Path, step: int, is_main: bool, group=None) -> None:
    """Collective: rank 0 looks, every rank stops together (ConfigError: rank 0 prints it, once)."""
    problem = shortage(checkpoints, root, step) if is_main else None
    if dist.is_initialized():
        box = [problem]
        dist.broadcast_object_list(box, src=0, group=group)
        problem = box[0]
    if problem:
        raise ConfigError(problem)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"

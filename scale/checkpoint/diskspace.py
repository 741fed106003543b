"""A full disk is a clear stop, not a rank's traceback: before each checkpoint (and at start-up, for a run that
has saved one) the free space of the run directory is compared with the size of the last checkpoint
(checkpoints/saves.jsonl). When it is short, the run stops before writing anything (exit 2, one message naming the
run directory, the space needed and the newest intact checkpoint, which stays loadable); a start-up with too little
space is refused the same way. A fresh run's first checkpoint is compared with the size of its model's weights
(student and teacher, as saved: a lower bound, so that a refusal is never a false alarm).

A disk that fills while a checkpoint is being written (or any write that fails with an OSError) is the same clear
stop: the ranks agree (scale.checkpoint.checkpointer), rank 0 removes the step's partial folder and says what
failed, on which rank, and the space the checkpoint needs (write_failed)."""

import logging
import shutil
import threading
from pathlib import Path

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from scale.checkpoint.store import SAVES, CheckpointStore
from scale.errors import ConfigError, is_disk_full, os_error
from scale.faults import active
from scale.readback import SAVES_LINE, BadFile, read_json_lines

_WARNED: set[str] = set()  # the damaged saves.jsonl records already named
FREE_SOME_SPACE = "free some space (or lower train.keep_last) and run the same command again to continue from it"


def expected_bytes(checkpoints: Path) -> int | None:
    """The size of the last sealed checkpoint, which the next one will match; None before the first."""
    try:
        saves = read_json_lines(checkpoints / SAVES, SAVES_LINE, torn_tail=True)
    except BadFile as err:  # only an estimate: a damaged record costs the check, not the run (said once)
        if str(err) not in _WARNED:
            logging.getLogger(__name__).warning(
                "%s; the free-space check before a save uses the model's size instead", err
            )
        _WARNED.add(str(err))
        return None
    except OSError:
        return None
    return saves[-1]["bytes"] if saves else None


def weights_bytes(*modules) -> int:
    """The bytes the modules' parameters and buffers take in full (an FSDP2 DTensor's numel is the full one; a
    ZeRO-3 parameter's is in ds_numel); None modules count 0."""
    tensors = [t for m in modules if m is not None for t in (*m.parameters(), *m.buffers())]
    return sum(getattr(t, "ds_numel", t.numel()) * t.element_size() for t in tensors)


def free_bytes(path: Path, step: int) -> int:
    return 0 if active("disk_full", step) else shutil.disk_usage(path).free


def shortage(checkpoints: Path, root: Path, step: int, first: int | None = None) -> str | None:
    """Why the next checkpoint does not fit, or None; `first`: the least a first checkpoint takes."""
    need, basis = expected_bytes(checkpoints), "the last one's size"
    if need is None:
        need, basis = first, "at least the model's weights: the first checkpoint"
    if need is None:
        return None
    free = free_bytes(checkpoints, step)
    if free >= need:
        return None
    return (
        f"run directory {root}: disk full: the next checkpoint needs about {_size(need)} ({basis}), "
        f"{_size(free)} is free. {_newest(checkpoints)}; {FREE_SOME_SPACE}"
    )


def write_errors(err: BaseException, rank: int) -> list[tuple[int, OSError]]:
    """The OSErrors behind a failed write, with the rank that hit each (DCP gathers every rank's into its
    CheckpointException); [] when the failure is not the file system's."""
    if isinstance(err, CheckpointException):
        found = [(r, os_error(failure[0])) for r, failure in err.failures.items()]
        return [(r, e) for r, e in found if e is not None]
    found = os_error(err)
    return [] if found is None else [(rank, found)]


def write_failed(
    checkpoints: Path, root: Path, step: int, failures: list[tuple[int, OSError]], written: int, first: int
) -> str:
    """What rank 0 says when the ranks stopped because writing the checkpoint of `step` failed; `failures`: every
    rank's (rank, error), `written`: the bytes on disk when it failed, `first`: the least a first checkpoint takes."""
    ranks: dict[str, list[int]] = {}
    for rank, err in failures:
        ranks.setdefault(f"{err.strerror or err}{_file(err)}", []).append(rank)
    what = "; ".join(f"{_ranks(sorted(set(r)))}: {text}" for text, r in sorted(ranks.items()))
    if not any(is_disk_full(err) for _, err in failures):
        return f"run directory {root}: writing the checkpoint of step {step} failed ({what}). {_newest(checkpoints)}"
    last = expected_bytes(checkpoints)
    if last is not None:
        need = f"about {_size(last)} (the last one's size)"
    elif written > first:
        need = f"more than {_size(written)} (written before the disk filled)"
    else:
        need = f"at least {_size(first)} (the model's weights)"
    free = shutil.disk_usage(checkpoints).free
    return (
        f"run directory {root}: disk full while writing the checkpoint of step {step} ({what}); its partial files "
        f"are removed. It needs {need}, {_size(free)} is free. {_newest(checkpoints)}; {FREE_SOME_SPACE}"
    )


def _newest(checkpoints: Path) -> str:
    found = CheckpointStore(checkpoints).candidates()
    return f"The newest intact checkpoint is {found[0] if found else 'none'}"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _file(err: OSError) -> str:
    return f": {err.filename}" if err.filename else ""


def quiet_full_disk_in_threads() -> None:
    """A library's writer thread that dies of a full disk (TensorBoard's event writer, while an async checkpoint
    fills the disk) logs one warning instead of a traceback: the checkpoint's own check stops the run, cleanly."""
    default = threading.excepthook

    def hook(args) -> None:
        if is_disk_full(args.exc_value):
            thread = args.thread.name if args.thread else "a thread"
            logging.getLogger(__name__).warning("%s stopped writing: %s", thread, args.exc_value)
        else:
            default(args)

    threading.excepthook = hook


def check_start(checkpoints: Path, root: Path) -> None:
    """At start-up, before any rank starts: refuse when the next checkpoint cannot fit."""
    problem = shortage(checkpoints, root, 0)
    if problem:
        raise ConfigError(problem)


def check_before_save(
    checkpoints: Path, root: Path, step: int, is_main: bool, group=None, first: int | None = None
) -> None:
    """Collective: rank 0 looks, every rank stops together (ConfigError: rank 0 prints it, once). `first`: the
    least the first checkpoint takes (weights_bytes), for a run that has saved none."""
    problem = shortage(checkpoints, root, step, first) if is_main else None
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

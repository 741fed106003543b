"""Files scale writes in a run directory, opened without following a symbolic link.

In a group-writable run directory anyone could plant `metrics.jsonl -> ~someone/thesis.tex` (or `.lock`, or
`logs/rank0.log`) and have the next run append to, or truncate, a file of whoever starts it. So a file scale writes
there is opened with O_NOFOLLOW, and a temporary file is created anew (O_EXCL) before it replaces the real one
(a rename replaces a link, it never writes through it); a link where scale writes is refused with one line naming
it (exit 2). `scale train` looks for such links before it starts the ranks (scale.loop.rundir), so that the
refusal comes once, from the launcher; the opens here guard every later write as well.
"""

import errno
import os
from pathlib import Path

from scale.errors import UserError


class LinkRefused(UserError):
    """A symbolic link where scale writes a file of its own."""


def refusal(path: Path) -> LinkRefused:
    return LinkRefused(
        f"{path}: a symbolic link (to {os.readlink(path)}) where scale writes a file of its own: refused, so that no "
        "file elsewhere is overwritten; remove the link (and check who made it)"
    )


def open_fd(path: str | Path, flags: int, mode: int = 0o644) -> int:
    """os.open that refuses a link at `path` (LinkRefused) instead of opening what it points to."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise refusal(Path(path)) from None
        raise


def open_text(path: str | Path, mode: str = "a", encoding: str = "utf-8"):
    """A text file opened for appending ('a') or rewriting ('w'), never through a link."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(open_fd(path, flags), mode, encoding=encoding)


def write_atomic(path: str | Path, text: str, fsync: bool = False) -> None:
    """Replace `path` with `text`: a fresh temporary file (whatever stood at its name, a link included, goes
    first), renamed over `path` (which replaces a link there, never writes through it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w", encoding="utf-8") as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def refuse_links(paths) -> None:
    """LinkRefused naming the first of `paths` that is a symbolic link (a missing one is fine)."""
    for path in map(Path, paths):
        if path.is_symlink():
            raise refusal(path)

"""Files scale writes, opened without following a symbolic link, and the one atomic replace of a file.

In a group-writable run directory anyone could plant `metrics.jsonl -> ~someone/thesis.tex` (or `.lock`, or
`logs/rank0.log`) and have the next run append to, or truncate, a file of whoever starts it. So a file scale writes
there is opened with O_NOFOLLOW, and a temporary file is created anew (O_EXCL) before it replaces the real one
(a rename replaces a link, it never writes through it); a link where scale writes is refused with one line naming
it (exit 2). `scale train` looks for such links before it starts the ranks (scale.loop.rundir), so that the
refusal comes once, from the launcher; the opens here guard every later write as well. Every file scale replaces
whole (a run directory's small files, shards and their indexes, saved features, the planner's trace cache) goes
through `replacing`, which names its temporary file for one writer or for several at once.
"""

import errno
import os
import secrets
from contextlib import contextmanager
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


@contextmanager
def replacing(path: str | Path, binary: bool = False, fsync: bool = False, concurrent: bool = False):
    """A new file, open for writing, that replaces `path` when the block ends, and is removed when it raises: a
    reader sees the old file or the whole new one, never half of one. The temporary file beside `path` is created
    anew (O_EXCL, never through a link) and renamed over `path` (which replaces a link there, never writes through
    it). It is `.NAME.tmp` where one process writes `path` (whatever stood at that name, a killed write's leftover or
    a link, goes first), or `.NAME.<random>.tmp`, one per writer, where several may write `path` at once
    (`concurrent`: a shared cache or data directory), so that no writer removes or renames another's.
    The file's `temporary` is that path: a writer that describes what it wrote (a checksum, a size) reads it there
    inside the block, its own bytes, where `path` may already hold another writer's."""
    path = Path(path)
    fd, tmp = _fresh(path) if concurrent else _fixed(path)
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            f.temporary = tmp
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: str | bytes, fsync: bool = False, concurrent: bool = False) -> None:
    """Replace `path` with `data` (text or bytes), as `replacing` does."""
    with replacing(path, isinstance(data, bytes), fsync, concurrent) as f:
        f.write(data)


CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def _fixed(path: Path) -> tuple[int, Path]:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    return open_fd(tmp, CREATE), tmp


def _fresh(path: Path, tries: int = 8) -> tuple[int, Path]:
    """A temporary name no other writer holds: 64 random bits, O_EXCL settling the (unlikely) collision."""
    for _ in range(tries):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return open_fd(tmp, CREATE), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside it after {tries} tries", str(path))


def refuse_links(paths) -> None:
    """LinkRefused naming the first of `paths` that is a symbolic link (a missing one is fine)."""
    for path in map(Path, paths):
        if path.is_symlink():
            raise refusal(path)

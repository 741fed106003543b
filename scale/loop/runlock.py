"""One live run per run directory: `scale train` takes an exclusive lock on RUN_DIR/.lock before it starts the ranks
and records its owner there (pid, host, Slurm job, start time); a second `scale train` on the same directory exits 2
naming that owner.

The lock is flock(2): the kernel (or, on a shared file system, the file server) releases it when the process that
holds it dies, however it dies. So a lock left by a run killed with -9, or by a node that went down under Slurm
(NFSv4 and Lustre mounted with -o flock drop a dead client's locks when its lease ends), is free again, and the
next run takes it over, saying whose it was. A file system without flock support runs unlocked, with a warning.
The ranks that `--nproc` starts inherit the lock, so it is held until the last of them has exited.
"""

import contextlib
import fcntl
import logging
import os
import socket
import time
from pathlib import Path

import torch.distributed as dist

from scale.errors import ConfigError
from scale.nofollow import open_fd

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"


def owner_line() -> str:
    job = os.environ.get("SLURM_JOB_ID")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return f"pid {os.getpid()} on host {socket.gethostname()}" + (f", Slurm job {job}" if job else "") + f", {started}"


class RunLock:
    def __init__(self, root: str | Path):
        self.path = Path(root) / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ConfigError naming its owner; a stale owner's record is taken over."""
        fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)  # a link there is refused, never truncated
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd)
            os.close(fd)
            raise ConfigError(
                f"run directory {self.path.parent} is in use by another `scale train` ({owner or 'owner unknown'}); "
                f"wait for it to end or stop it, or train in another --run-dir"
            ) from None
        except OSError as err:  # ENOLCK, EOPNOTSUPP: a file system without flock
            os.close(fd)
            log.warning("run directory %s: no lock (%s): make sure no other run uses it", self.path.parent, err)
            return
        stale = _read(fd)
        if stale:
            log.warning("run directory %s: taking over the lock of a run that is gone (%s)", self.path.parent, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (owner_line() + "\n").encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Mark the lock free (an empty file) and drop it; the kernel drops it anyway when the process ends."""
        if self.fd is None:
            return
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode(errors="replace").strip()


@contextlib.contextmanager
def hold(root: Path, group=None, inherited: bool = False):
    """The run's lock for the ranks of a run started by torchrun or srun (or one process): global rank 0 takes it
    and tells the others (over `group`) whether it could. `inherited`: a `--nproc` launcher holds it already."""
    if inherited:
        yield
        return
    lock = RunLock(root)
    problem = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        try:
            lock.acquire()
        except ConfigError as err:
            problem = str(err)
    if dist.is_initialized():
        box = [problem]
        dist.broadcast_object_list(box, src=0, group=group)
        problem = box[0]
    if problem:
        raise ConfigError(problem)  # rank 0 prints it
    try:
        yield
    finally:
        lock.release()

"""Errors that are the user's to fix: the CLI prints them without a traceback and exits with status 2."""

import errno
import os
import sys

# set in the ranks that `--nproc` spawns (scale/launch/local.py): the process that spawned them speaks for them
LAUNCH_MARK = "SCALE_LOCAL_LAUNCH"


class UserError(Exception):
    """A bad recipe, override, path or input; the message names the file, key or sample."""

    exit_code = 2


class ConfigError(UserError):
    """A bad recipe or launch setting, found before the ranks part ways: every rank finds the same one, so only
    rank 0 prints it."""


# Exit status of a run that checkpointed on a preemption signal and wants to be requeued (the Slurm template
# requeues on it); distinct from 0 (finished), 1 (crashed) and 2 (user error).
PREEMPTED_EXIT_CODE = 3


class NonFiniteLoss(UserError):
    """The loss became NaN or infinite; the run stops before the optimizer step so the last checkpoint is clean."""

    exit_code = 1


def os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind `err`: itself, or what caused it or was being handled when it was raised (torch.save's
    writer, for one, raises a RuntimeError while closing a file whose write failed with ENOSPC)."""
    while err is not None and not isinstance(err, OSError):
        err = err.__cause__ or err.__context__
    return err


def is_disk_full(err: BaseException) -> bool:
    """No space left, or the user's quota used up (clusters' scratch file systems)."""
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


def speaks_for_launch() -> bool:
    """Whether this process prints what every process of a launch finds alike: the process that spawns `--nproc`
    ranks, rank 0 under torchrun or srun, a process on its own."""
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
    return rank == "0" and LAUNCH_MARK not in os.environ


_NOTICES: set[str] = set()


def notice(message: str) -> None:
    """Print `message` (e.g. a deprecation) to stderr once per process and once per launch."""
    if message not in _NOTICES and speaks_for_launch():
        print(f"scale: {message}", file=sys.stderr)
    _NOTICES.add(message)

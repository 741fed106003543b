"""Errors that are the user's to fix: the CLI prints them without a traceback and exits with status 2."""


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

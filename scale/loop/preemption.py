"""Preemption: a signal (SIGTERM, SIGUSR1, ...) sets a flag; at a step boundary all ranks agree to stop, the loop
saves a checkpoint and exits with PREEMPTED_EXIT_CODE so the Slurm wrapper requeues the job."""

import logging
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

from scale.errors import PREEMPTED_EXIT_CODE, UserError
from scale.launch.local import AS_SIGNAL, ignore_at_exit

log = logging.getLogger(__name__)

# Set by a launcher that ends every task once one exits non-zero (the sbatch template: srun --kill-on-bad-exit).
# There the first task out with PREEMPTED_EXIT_CODE would kill its peers while they still finish, so a preempted
# task creates this file instead and exits 0; the launcher reads the file.
PREEMPTED_MARKER_ENV = "SCALE_PREEMPTED_MARKER"


def launcher_status(status: int) -> int:
    """The exit status for the launcher: PREEMPTED_EXIT_CODE becomes the marker file and 0 when one is asked for."""
    marker = os.environ.get(PREEMPTED_MARKER_ENV)
    if marker and status == PREEMPTED_EXIT_CODE:
        Path(marker).touch()
        return 0
    return status


# A closed terminal or dropped ssh session (SIGHUP) and Ctrl-C (SIGINT) at a run that is its own launcher (`scale
# train` without --nproc, torchrun or srun): checkpoint and exit PREEMPTED_EXIT_CODE, as the ranks of `--nproc N` do
# when the local launcher forwards these two as SIGTERM (scale.launch.local.run_ranks); a second Ctrl-C stops at once.
OWN_LAUNCHER_SIGNALS = tuple(AS_SIGNAL)  # the signals the local launcher turns into SIGTERM for its ranks


class Preemption:
    def __init__(self, signal_names: list[str], group: dist.ProcessGroup | None = None, own_launcher: bool = False):
        """`group`: the ranks that must stop together (the data-parallel group: every rank of the run).
        `own_launcher`: this process was started by no launcher (see OWN_LAUNCHER_SIGNALS)."""
        self.received: str | None = None
        self.group = group
        for name in signal_names:
            sig = getattr(signal, name, None)
            if not isinstance(sig, signal.Signals):
                raise UserError(f"train.preempt_signals: unknown signal '{name}' (e.g. SIGTERM, SIGUSR1)")
            signal.signal(sig, self._handle)
            ignore_at_exit([sig])  # a signal while the process exits must not kill it (exit 3 would become 128+n)
        if own_launcher:
            for sig in OWN_LAUNCHER_SIGNALS:
                signal.signal(sig, self._handle_own)
            ignore_at_exit([signal.SIGHUP])  # Ctrl-C stays Ctrl-C while the process exits: it is at a terminal

    def _handle(self, signum, _frame) -> None:
        self.received = signal.Signals(signum).name

    def _handle_own(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.received:  # Ctrl-C after a stop signal: stop now, as Python would
            signal.default_int_handler(signum, frame)
        self.received = self.received or signal.Signals(signum).name

    def requested(self) -> bool:
        """True on every rank as soon as any rank received a signal (one tiny all-reduce per call)."""
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32)
        if self.group is not None:
            if dist.get_backend(self.group) == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if flag.item() and self.received:
            log.warning("received %s: checkpointing and exiting for requeue", self.received)
        return bool(flag.item())

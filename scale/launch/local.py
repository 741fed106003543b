"""Spawn N local processes of a `scale` command (CPU/gloo runs, the demo and tests), with torchrun's variables.

Under torchrun or srun this is not used: those launchers start the processes themselves.
"""

import os
import signal
import subprocess
import sys
import time

from scale import faults
from scale.engine.dist import free_port
from scale.errors import PREEMPTED_EXIT_CODE

LAUNCH_MARK = "SCALE_LOCAL_LAUNCH"
# what a new launch must not inherit from its caller: a process group's variables and the launch mark (they would
# make it join the caller's group, or skip spawning), and a fault meant for another run
INHERITED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", LAUNCH_MARK, faults.ENV)


def fresh_environment() -> dict[str, str]:
    """This process's environment without the INHERITED variables."""
    return {k: v for k, v in os.environ.items() if k not in INHERITED}


def already_launched() -> bool:
    return any(k in os.environ for k in ("RANK", "SLURM_PROCID", LAUNCH_MARK))


def spawn(nproc: int, argv: list[str]) -> int:
    """Run `python -m scale.cli *argv` in nproc processes; stop all when one fails; forward SIGTERM/SIGUSR1/SIGINT
    to every process (so preemption reaches each rank). Returns the first non-zero exit status, else 0."""
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
            **{LAUNCH_MARK: "1"},
        )
        procs.append(subprocess.Popen([sys.executable, "-m", "scale.cli", *argv], env=env))

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        return _wait(procs)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(procs: list[subprocess.Popen], grace_s: float = 5.0) -> int:
    """Wait for every process. A failure stops the others after `grace_s`; a preempted rank (its checkpoint is
    written, all ranks agreed to stop) does not, as the others may still be finishing theirs."""
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [p.returncode for p in procs if p.returncode not in (None, 0, PREEMPTED_EXIT_CODE)]
        if failed and not status:
            status = failed[0]
            time.sleep(grace_s)  # let the other ranks report the failure themselves before they are stopped
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
        time.sleep(0.1)
    return status or next((p.returncode for p in procs if p.returncode), 0)

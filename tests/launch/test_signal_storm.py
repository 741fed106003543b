"""A storm of preemption signals keeps the preemption exit status: a rank (its Preemption handlers) or a launcher
(`scale train --nproc`'s) that exits with 3 while SIGUSR1 keeps coming still exits with 3, never killed by a signal
that came while Python was putting its handlers back to the defaults at exit (the launch exited 138, and Slurm did
not requeue it). One small process each, not a training run: what is tested is the process's exit."""

import signal
import subprocess
import sys
import time

import pytest

from scale.errors import PREEMPTED_EXIT_CODE

# the process waits for the first signal, then exits with 3 while the signals keep coming
SETUP = {
    "rank": "from scale.loop.preemption import Preemption; Preemption(['SIGTERM', 'SIGUSR1'])",
    "launcher": "from scale.launch.local import catch_early_signals; catch_early_signals(); import torch",
}
WAIT_AND_EXIT = "print('ready', flush=True); import signal, sys; signal.pause(); sys.exit(3)"


@pytest.mark.parametrize("who", ["rank", "launcher"])
def test_signals_while_exiting_keep_the_preemption_status(who):
    proc = subprocess.Popen([sys.executable, "-c", f"{SETUP[who]}; {WAIT_AND_EXIT}"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    sent = 0
    while proc.poll() is None:  # as fast as they come, until it has exited
        try:
            proc.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            break
        sent += 1
        time.sleep(0.002)  # hundreds a second: many land in the exit, whose finalization takes longer
    assert proc.wait(timeout=60) == PREEMPTED_EXIT_CODE, f"status {proc.returncode} after {sent} signals"

"""Fault injection: SCALE_FAULT="POINT@STEP" makes every rank hit a fault at a named point of step STEP.

Points:
- `step`: SIGKILL right after optimizer step STEP completed (the resume tests);
- `save`: SIGKILL inside the checkpoint write of STEP, after the files are on disk and before the directory is
  sealed (the resume tests);
- `preempt`: SIGUSR1 right after step STEP, as Slurm's preemption notice would send it (the demo interrupts itself
  this way at a known step: a signal sent from outside can arrive after a short run has already finished);
- `disk_full`: the run directory's file system reports no free space when the checkpoint of STEP is about to be
  written (STEP 0: at start-up), as a full disk would (scale/loop/diskspace.py).
Unset in normal runs: each check is one dict lookup.
"""

import os
import signal

ENV = "SCALE_FAULT"
SIGNALS = {"step": signal.SIGKILL, "save": signal.SIGKILL, "preempt": signal.SIGUSR1}
POINTS = (*SIGNALS, "disk_full")


def spec(point: str, step: int) -> str:
    if point not in POINTS:
        raise ValueError(f"unknown fault point '{point}' (one of {', '.join(POINTS)})")
    return f"{point}@{step}"


def active(point: str, step: int) -> bool:
    wanted = os.environ.get(ENV)
    return bool(wanted) and wanted == spec(point, step)


def maybe_inject(point: str, step: int) -> None:
    if active(point, step):
        os.kill(os.getpid(), SIGNALS[point])

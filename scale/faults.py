"""Fault injection: SCALE_FAULT="POINT@STEP" makes every rank hit a fault at a named point of step STEP.

Points:
- `step`: SIGKILL right after optimizer step STEP completed (the resume tests);
- `save`: SIGKILL inside the checkpoint write of STEP, after the files are on disk and before the directory is
  sealed (the resume tests);
- `seal`, written `seal@STEP:STAGE`: SIGKILL of rank 0 while it seals the checkpoint of STEP, at STAGE: `meta` (meta.json
  written, the folder not yet renamed), `renamed` (the step folder renamed, `latest` not yet moved), `latest` (`latest`
  moved, saves.jsonl and retention not yet done): the moments of a commit that a preempted job's SIGKILL can hit;
- `preempt`: SIGUSR1 right after step STEP, as Slurm's preemption notice would send it (the demo interrupts itself
  this way at a known step: a signal sent from outside can arrive after a short run has already finished);
- `disk_full`: the run directory's file system reports no free space when the checkpoint of STEP is about to be
  written (STEP 0: at start-up), as a full disk would (scale/checkpoint/diskspace.py);
- `disk_fills`, written `disk_fills@STEP:FILE`: the disk fills while the checkpoint of STEP is being written, at
  FILE (a path inside the step's folder, e.g. `dcp/__1_0.distcp`, the DCP data of rank 1): FILE is made a link to
  /dev/full, so whichever rank writes it gets the kernel's own ENOSPC from inside the real write path.
Unset in normal runs: each check is one dict lookup.
"""

import os
import signal
from pathlib import Path

ENV = "SCALE_FAULT"
SIGNALS = {"step": signal.SIGKILL, "save": signal.SIGKILL, "seal": signal.SIGKILL, "preempt": signal.SIGUSR1}
POINTS = (*SIGNALS, "disk_full", "disk_fills")
FULL_DEVICE = "/dev/full"  # every write to it fails with ENOSPC


def spec(point: str, step: int, where: str | None = None) -> str:
    if point not in POINTS:
        raise ValueError(f"unknown fault point '{point}' (one of {', '.join(POINTS)})")
    return f"{point}@{step}" + (f":{where}" if where else "")


def active(point: str, step: int) -> bool:
    wanted = os.environ.get(ENV)
    return bool(wanted) and wanted.partition(":")[0] == spec(point, step)


def maybe_inject(point: str, step: int) -> None:
    if active(point, step):
        os.kill(os.getpid(), SIGNALS[point])


def maybe_inject_at(point: str, step: int, where: str) -> None:
    """`POINT@STEP:WHERE`: the fault of `point` at step `step`, only at the stage named `where`."""
    if active(point, step) and os.environ[ENV].partition(":")[2] == where:
        os.kill(os.getpid(), SIGNALS[point])


def maybe_fill_disk(folder: Path, step: int) -> None:
    """`disk_fills@STEP:FILE`: make FILE inside `folder` (the step's staging folder) a link to /dev/full. One rank
    calls it, before any rank writes."""
    if active("disk_fills", step):
        target = folder / os.environ[ENV].partition(":")[2]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(FULL_DEVICE)

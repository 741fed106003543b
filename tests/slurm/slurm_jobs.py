"""Waiting on Slurm jobs in tests."""

import subprocess
import time
from pathlib import Path

import pytest

from scale.launch.slurm import job_state

FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def wait_for_state(job_id: str, states: set[str], timeout: float) -> dict:
    """Poll scontrol until the job reaches one of `states` (or any final state); returns its last state."""
    deadline = time.monotonic() + timeout
    info: dict = {}
    while time.monotonic() < deadline:
        info = job_state(job_id) or {}
        state = info.get("jobstate", "")
        if state in states or state in FINAL_STATES:
            return info
        time.sleep(0.5)
    subprocess.run(["scancel", job_id])
    pytest.fail(f"job {job_id} did not reach {sorted(states)} within {timeout:.0f} s; last state {info}")


def wait_for_file(path: Path, timeout: float, job_id: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return
        if job_id is not None and (job_state(job_id) or {}).get("jobstate") in FINAL_STATES:
            pytest.fail(f"job {job_id} ended before {path} appeared: {job_state(job_id)}")
        time.sleep(0.2)
    if job_id is not None:
        subprocess.run(["scancel", job_id])
    pytest.fail(f"{path} did not appear within {timeout:.0f} s")


def job_logs(run_dir: Path) -> str:
    """Every slurm-*.out/.err under the run directory, for failure messages."""
    return "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in sorted(run_dir.rglob("slurm-*")))

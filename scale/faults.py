"""Fault injection for the resume tests: SCALE_FAULT="POINT@STEP" SIGKILLs this process at a named point.

Points: `step` (right after optimizer step STEP completed), `save` (inside the checkpoint write of STEP, after the
files are on disk and before the directory is sealed). Unset in normal runs: each check is one dict lookup.
"""

import os
import signal

ENV = "SCALE_FAULT"


def maybe_kill(point: str, step: int) -> None:
    spec = os.environ.get(ENV)
    if spec and spec == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)

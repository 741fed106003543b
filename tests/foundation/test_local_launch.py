"""The local launcher's wait: a failed rank stops the others, a preempted one does not."""

import subprocess
import sys

import pytest

from scale.errors import PREEMPTED_EXIT_CODE
from scale.launch.local import _wait

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def rank(tmp_path, name: str, delay: float, status: int) -> subprocess.Popen:
    """A stand-in rank: after `delay` s it writes its name (its share of a checkpoint) and exits with `status`."""
    code = (
        f"import time, pathlib; time.sleep({delay}); "
        f"pathlib.Path({str(tmp_path / name)!r}).write_text('done'); raise SystemExit({status})"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_preempted_rank_does_not_stop_the_slower_ones(tmp_path):
    procs = [rank(tmp_path, "r0", 0, PREEMPTED_EXIT_CODE), rank(tmp_path, "r1", 1.5, PREEMPTED_EXIT_CODE)]
    assert _wait(procs, grace_s=0.2) == PREEMPTED_EXIT_CODE
    assert (tmp_path / "r1").exists()


def test_a_failed_rank_stops_the_others_after_the_grace_period(tmp_path):
    procs = [rank(tmp_path, "r0", 0, 1), rank(tmp_path, "r1", 30, 0)]
    assert _wait(procs, grace_s=0.2) == 1
    assert procs[1].returncode is not None and not (tmp_path / "r1").exists()

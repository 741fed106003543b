"""The local launcher's wait: a failed rank stops the others, a preempted one does not, a dead rank is seen
whatever its place, and signals end the run even when ranks are stuck."""

import os
import signal
import subprocess
import sys
import time

import pytest

from scale.errors import PREEMPTED_EXIT_CODE
from scale.launch.local import Ranks

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def rank(tmp_path, name: str, delay: float, status: int) -> subprocess.Popen:
    """A stand-in rank: after `delay` s it writes its name (its share of a checkpoint) and exits with `status`."""
    code = (
        f"import time, pathlib; time.sleep({delay}); "
        f"pathlib.Path({str(tmp_path / name)!r}).write_text('done'); raise SystemExit({status})"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def stuck_rank(tmp_path, name: str) -> subprocess.Popen:
    """A rank stuck in a collective: SIGTERM only sets its preemption flag; it would finish after 60 s."""
    code = (
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, lambda *a: None); "
        f"time.sleep(60); pathlib.Path({str(tmp_path / name)!r}).write_text('done')"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def wait(procs: list[subprocess.Popen], grace_s: float = 0.2) -> int:
    ranks = Ranks(grace_s, stop_grace_s=60)
    ranks.procs = procs
    return ranks.wait()


def test_a_preempted_rank_does_not_stop_the_slower_ones(tmp_path):
    procs = [rank(tmp_path, "r0", 0, PREEMPTED_EXIT_CODE), rank(tmp_path, "r1", 1.5, PREEMPTED_EXIT_CODE)]
    assert wait(procs) == PREEMPTED_EXIT_CODE
    assert (tmp_path / "r1").exists()


def test_a_failed_rank_stops_the_others_after_the_grace_period(tmp_path):
    procs = [rank(tmp_path, "r0", 0, 1), rank(tmp_path, "r1", 30, 0)]
    assert wait(procs) == 1
    assert procs[1].returncode is not None and not (tmp_path / "r1").exists()


def test_a_killed_rank_behind_a_stuck_one_ends_the_run(tmp_path):
    """Rank 1 dies while rank 0 waits for it in a collective (and ignores SIGTERM): both are gone at once."""
    killed = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(0.5); os.kill(os.getpid(), 9)"])
    procs = [stuck_rank(tmp_path, "r0"), killed]
    assert wait(procs) == 128 + signal.SIGKILL
    assert procs[0].returncode == -signal.SIGKILL and not (tmp_path / "r0").exists()


# stand-in ranks for the whole launcher: each writes ready<RANK> once started; `handler` ranks then take SIGTERM as
# a preemption request (and stay stuck), the others have no handler yet (the first seconds of start-up)
RANK_CODE = """
import os, pathlib, signal, sys, time
folder, handled = pathlib.Path(sys.argv[1]), sys.argv[2].split(",")
if os.environ["RANK"] in handled:
    signal.signal(signal.SIGTERM, lambda *a: None)
(folder / f"ready{os.environ['RANK']}").touch()
time.sleep(60)
(folder / f"finished{os.environ['RANK']}").touch()
"""


def launcher(tmp_path, handled: str, stop_grace_s: float) -> subprocess.Popen:
    code = (
        "import sys; from scale.launch.local import run_ranks; "
        f"sys.exit(run_ranks(2, [sys.executable, '-c', {RANK_CODE!r}, {str(tmp_path)!r}, {handled!r}], "
        f"grace_s=0.5, stop_grace_s={stop_grace_s}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, "stand-in ranks did not start"
        time.sleep(0.05)
    return proc


def finish(proc: subprocess.Popen, tmp_path) -> int:
    try:
        status = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the launcher did not end")
    assert not list(tmp_path.glob("finished*")), "a rank ran to its end instead of being stopped"
    return status


def test_sigterm_while_ranks_are_stuck_ends_the_run_after_the_stop_grace(tmp_path):
    proc = launcher(tmp_path, handled="0,1", stop_grace_s=1)
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, tmp_path) == 1


def test_a_second_signal_kills_stuck_ranks_at_once(tmp_path):
    proc = launcher(tmp_path, handled="0,1", stop_grace_s=60)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # the same notice twice (as `timeout` delivers it): not a second request
    time.sleep(2.5)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, tmp_path) == 1


def test_a_signal_during_start_up_is_a_preemption_not_a_signal_death(tmp_path):
    """Rank 1 has no handler yet and dies of SIGTERM; rank 0 is left waiting for it: exit 3, at once."""
    proc = launcher(tmp_path, handled="0", stop_grace_s=60)
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc, tmp_path) == PREEMPTED_EXIT_CODE


def test_ranks_that_fail_together_report_the_failure(tmp_path):
    procs = [rank(tmp_path, "r0", 0, 1), rank(tmp_path, "r1", 0, 1)]
    for proc in procs:
        proc.wait()  # both are gone before the launcher looks
    assert wait(procs) == 1

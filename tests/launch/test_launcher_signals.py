"""`scale train --nproc 2` under a closed terminal, Ctrl-C and kill -9, and a second launch on a busy run directory:
SIGHUP and one SIGINT checkpoint and exit 3 (Ctrl-C too at a run without --nproc, its own launcher), a second SIGINT stops at once, a signal while the launcher is still
loading the recipe stops it with exit 3, no rank outlives the launcher, and one run directory has one live run."""

import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from scale.errors import PREEMPTED_EXIT_CODE, ConfigError
from scale.loop.runlock import RunLock
from tests.helpers_run import TINY, clean_env, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

LONG = TINY + ["train.max_steps=100000", "train.ckpt_every_steps=100000"]
TIMEOUT = 300  # a guard against a hang on a loaded machine, never reached by a passing run


def launch(data, run_dir, overrides=LONG, nproc: int = 2) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "scale.cli", "train", "demo/dino_tiny", *overrides, "--run-dir", str(run_dir)]
    err = open(run_dir.parent / f"{run_dir.name}.stderr", "w")
    cmd += ["--nproc", str(nproc)] if nproc > 1 else []
    return subprocess.Popen(cmd, env=clean_env(data), stderr=err, text=True)


def stderr_of(run_dir) -> str:
    return (run_dir.parent / f"{run_dir.name}.stderr").read_text()


def wait_for(condition, what: str):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def training(run_dir, nproc: int = 2) -> bool:
    """Every rank is past its first step (their preemption handlers are installed)."""
    logs = [run_dir / "logs" / f"rank{r}.log" for r in range(nproc)]
    metrics = run_dir / "metrics.jsonl"
    return all(p.exists() for p in logs) and metrics.exists() and metrics.read_text().count("\n") >= 2


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether the process has a handler for `sig` (/proc's SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    except FileNotFoundError:
        return False
    return bool(mask & (1 << (sig - 1)))


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_hangup_or_one_ctrl_c_checkpoints_and_exits_3(embedded_data, tmp_path, sig):
    run_dir = tmp_path / "run"
    proc = launch(embedded_data, run_dir)
    wait_for(lambda: training(run_dir) or proc.poll() is not None, "training")
    ranks = children(proc.pid)
    assert len(ranks) == 2, stderr_of(run_dir)
    proc.send_signal(sig)
    assert proc.wait(TIMEOUT) == PREEMPTED_EXIT_CODE, stderr_of(run_dir)[-3000:]
    assert not any(alive(pid) for pid in ranks)
    assert list((run_dir / "checkpoints").glob("step_*")), "no checkpoint on the signal"
    assert "Traceback" not in stderr_of(run_dir)


def test_one_ctrl_c_at_a_run_without_launcher_checkpoints_and_exits_3(embedded_data, tmp_path):
    """Without --nproc the process is its own launcher: Ctrl-C does what it does to the ranks of --nproc 2."""
    run_dir = tmp_path / "run"
    proc = launch(embedded_data, run_dir, nproc=1)
    wait_for(lambda: training(run_dir, nproc=1) or proc.poll() is not None, "training")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(TIMEOUT) == PREEMPTED_EXIT_CODE, stderr_of(run_dir)[-3000:]
    assert list((run_dir / "checkpoints").glob("step_*")), "no checkpoint on Ctrl-C"
    assert "Traceback" not in stderr_of(run_dir)


def test_second_ctrl_c_stops_at_once(embedded_data, tmp_path):
    """The ranks look at the first signal only every 100000 steps: the second one is what ends them."""
    run_dir = tmp_path / "run"
    proc = launch(embedded_data, run_dir, LONG + ["train.preempt_check_every=100000"])
    wait_for(lambda: training(run_dir) or proc.poll() is not None, "training")
    ranks = children(proc.pid)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # two signals at once are one to the kernel
    proc.send_signal(signal.SIGINT)
    assert proc.wait(TIMEOUT) not in (0, PREEMPTED_EXIT_CODE)
    assert "second signal: killing every rank" in stderr_of(run_dir)
    wait_for(lambda: not any(alive(pid) for pid in ranks), "the ranks to end")


def test_hangup_while_loading_the_recipe_stops_cleanly(embedded_data, tmp_path):
    """The signal comes before any rank exists: the launcher exits 3 and starts none."""
    run_dir = tmp_path / "run"
    proc = launch(embedded_data, run_dir)
    wait_for(lambda: catches(proc.pid, signal.SIGHUP) or proc.poll() is not None, "the launcher's handler")
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(TIMEOUT) == PREEMPTED_EXIT_CODE, stderr_of(run_dir)[-3000:]
    assert "stopped by SIGHUP before the ranks started" in stderr_of(run_dir)
    assert not (run_dir / "logs" / "rank0.log").exists()


def test_one_live_run_per_run_directory_and_a_killed_owner_is_taken_over(embedded_data, tmp_path, caplog):
    run_dir = tmp_path / "run"
    first = launch(embedded_data, run_dir)
    wait_for(lambda: training(run_dir) or first.poll() is not None, "training")
    ranks = children(first.pid)
    second = run_train(embedded_data, run_dir, LONG, fork=False)
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.count("scale: error:") == 1 and "Traceback" not in second.stderr
    assert f"is in use by another `scale train` (pid {first.pid} on host" in second.stderr, second.stderr[-3000:]
    first.kill()  # kill -9: its ranks get SIGTERM, checkpoint and exit, holding the lock until they have
    first.wait()
    wait_for(lambda: not any(alive(pid) for pid in ranks), "the orphaned ranks to end")
    assert list((run_dir / "checkpoints").glob("step_*")), "the ranks did not checkpoint when the launcher died"
    lock = RunLock(run_dir)

    def take_over() -> bool:
        try:
            lock.acquire()
        except ConfigError:  # still held by what the ranks forked (their data workers) until those are gone
            return False
        return True

    with caplog.at_level(logging.WARNING, logger="scale.loop.runlock"):
        wait_for(take_over, "the lock to be free")
    assert lock.fd is not None and f"pid {os.getpid()}" in (run_dir / ".lock").read_text()
    lock.release()
    assert f"taking over the lock of a run that is gone (pid {first.pid}" in caplog.text
    assert (run_dir / ".lock").read_text() == ""  # released

"""A signal to `scale demo` reaches the processes it started: SIGTERM while it trains leaves nothing running."""

import signal
import subprocess
import sys
import time

import psutil
import pytest

from scale.launch.local import fresh_environment

pytestmark = pytest.mark.slow


def test_sigterm_to_demo_stops_its_training_ranks(tmp_path):
    env = dict(fresh_environment(), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    demo = subprocess.Popen(
        [sys.executable, "-m", "scale.cli", "demo", "--steps", "400", "--run-dir", str(tmp_path), "--nproc", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        rank_log = tmp_path / "dino" / "logs" / "rank1.log"
        deadline = time.monotonic() + 600
        while not (rank_log.is_file() and "training" in rank_log.read_text()):  # both ranks are in the loop
            assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read()
            time.sleep(0.5)
        started = psutil.Process(demo.pid).children(recursive=True)
        assert len(started) >= 3  # `scale train --nproc 2` and its two ranks
        demo.send_signal(signal.SIGTERM)
        out, _ = demo.communicate(timeout=300)
        assert demo.returncode == 128 + signal.SIGTERM, out
        assert "stopped by SIGTERM" in out
        left = [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [p.cmdline() for p in left]
    finally:
        for proc in psutil.Process(demo.pid).children(recursive=True) if demo.poll() is None else []:
            proc.kill()
        demo.kill()

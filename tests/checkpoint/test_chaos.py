"""Chaos: one rank is killed from outside at a random moment (while it trains or saves), the run is resumed, N
times; nothing hangs and the finished run is bit-identical to an uninterrupted one. SCALE_CHAOS_N sets N (default
2); SCALE_CHAOS_SEED picks the moments (printed, so that a failure can be replayed)."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.checkpoint.runs import OVERRIDES, assert_same_state, final_state, losses
from tests.helpers_run import clean_env, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def ranks_of(launcher: int) -> list[int]:
    """The rank processes the launcher started (not other children, e.g. a multiprocessing helper)."""
    try:
        pids = [int(c) for c in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()]
        return [pid for pid in pids if b"scale.cli" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    except OSError:
        return []


def kill_one_rank_at_random(data_root: Path, run_dir: Path, rng: random.Random) -> int | None:
    """Start the run, SIGKILL one rank once the run has been going for a random time; the launcher's status
    (None when the run finished before the kill)."""
    cmd = [sys.executable, "-m", "scale.cli", "train", "demo/dino_tiny", *OVERRIDES]
    cmd += ["--run-dir", str(run_dir), "--nproc", "2"]
    with open(run_dir.parent / f"{run_dir.name}.stderr", "ab") as err:  # a pipe nobody reads would fill and block
        proc = subprocess.Popen(cmd, env=clean_env(data_root), stdout=subprocess.DEVNULL, stderr=err)
    log = run_dir / "logs" / "rank0.log"
    # start-up is three Python processes importing torch: over a minute on a loaded 2-core machine (the flake loop
    # saw 120 s run out); this deadline is there for a launcher that hangs, not to time the start
    deadline = time.monotonic() + 600
    while not (log.exists() and "training" in log.read_text()) and proc.poll() is None:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    time.sleep(rng.uniform(0, 3))
    ranks = ranks_of(proc.pid)
    killed = proc.poll() is None and len(ranks) == 2
    if killed:
        os.kill(rng.choice(ranks), signal.SIGKILL)
    try:
        # after a kill the launcher must end the surviving rank within seconds; else the run finishes normally
        status = proc.wait(timeout=60 if killed else 300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the launcher did not end ({killed=})") from None
    return status


def test_random_kills_of_one_rank_resume_bit_identical(embedded_data, reference, tmp_path):
    seed = int(os.environ.get("SCALE_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"SCALE_CHAOS_SEED={seed}")
    for _ in range(int(os.environ.get("SCALE_CHAOS_N", "2"))):
        kill_one_rank_at_random(embedded_data, tmp_path, rng)
    out = run_train(embedded_data, tmp_path, OVERRIDES, fork=False)  # ranks as a user's launch starts them
    assert out.returncode == 0, out.stderr[-3000:]
    assert_same_state(final_state(reference), final_state(tmp_path))
    ref_losses, our_losses = losses(reference), losses(tmp_path)
    assert all(our_losses[s] == ref_losses[s] for s in our_losses), f"a resumed step saw other samples ({seed=})"

"""A launch forked by the fork server (tests/fork_server.py) behaves as the exec'd `python tests/forked_ranks.py
ARGS` it replaces: the same exit status, stdout and stderr for a success (which reads its environment and working
directory) and a usage error; the same negative status for a signal; subprocess.run's timeout."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fork_server
from tests.helpers_run import FORKED_RANKS, TINY, clean_env

pytestmark = pytest.mark.slow  # starts processes: `make test-fast` leaves it out

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "demo" / "dino_tiny.yaml"


def both(args: list[str], env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    cmd = [sys.executable, str(FORKED_RANKS), *args]
    forked = fork_server.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    execed = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    return forked, execed


def test_success_reads_the_launchs_environment_and_directory_as_an_execd_one(tmp_path):
    # a recipe found relative to the working directory, its data paths from the environment's SCALE_DATA
    (tmp_path / "mine.yaml").write_text(f"base: {DEMO}\n")
    env = clean_env(tmp_path / "my_data")
    forked, execed = both(["recipes", "show", "mine.yaml", "train.max_steps=3"], env, tmp_path)
    assert forked.returncode == execed.returncode == 0, forked.stderr[-2000:]
    assert f"{tmp_path}/my_data/embedded/digits/train" in forked.stdout and "max_steps: 3" in forked.stdout
    assert (forked.stdout, forked.stderr) == (execed.stdout, execed.stderr)
    assert fork_server._server(env).missing == []  # each PRELOAD name imports (a renamed module: update the list)


def test_usage_error_exits_2_with_the_same_message(tmp_path):
    forked, execed = both(["train", str(DEMO), "train.max_step=3", "--nproc", "2"], clean_env(tmp_path), tmp_path)
    assert forked.returncode == execed.returncode == 2
    assert "unknown key 'train.max_step'; did you mean 'train.max_steps'?" in forked.stderr
    assert (forked.stdout, forked.stderr) == (execed.stdout, execed.stderr)


def long_run(data: Path, run_dir: Path) -> list[str]:
    args = ["train", "demo/dino_tiny", *TINY, "train.max_steps=100000", "--run-dir", str(run_dir), "--nproc", "1"]
    return [sys.executable, str(FORKED_RANKS), *args]


def test_a_signal_and_a_timeout_end_the_launcher_as_an_execd_ones(embedded_data, tmp_path):
    env = clean_env(embedded_data)
    statuses = []
    for popen in (fork_server.popen, subprocess.Popen):
        proc = popen(long_run(embedded_data, tmp_path / popen.__name__), env=env, stdout=subprocess.DEVNULL)
        proc.send_signal(signal.SIGKILL)
        statuses.append(proc.wait(timeout=60))
    assert statuses == [-signal.SIGKILL] * 2
    # killed at the timeout, its output so far kept; the server serves the next launch
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        fork_server.run(long_run(embedded_data, tmp_path / "run"), env=env, capture_output=True, text=True, timeout=3)
    assert isinstance(expired.value.stderr, str)
    done = fork_server.run([sys.executable, str(FORKED_RANKS), "--help"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "train" in done.stdout

"""Run `scale train` in real processes for end-to-end tests (CPU, gloo)."""

import subprocess
import sys
from pathlib import Path

from scale.launch.local import fresh_environment
from tests import fork_server

# `scale` with its --nproc ranks forked from the launcher (see there); launched by fork_server.run or .popen
FORKED_RANKS = fork_server.FORKED_RANKS

TINY = [
    "train.global_batch=16",
    "train.log_every=1",
    "data.views.n_local=[2]",
    "method.dino.out_dim=64",
    "method.dino.hidden_dim=32",
    "method.dino.bottleneck_dim=16",
]


def clean_env(data_root: Path) -> dict:
    """The environment of a fresh `scale` launch reading ${SCALE_DATA}=data_root."""
    # fresh even after in-process distributed tests exported their process-group variables
    return dict(fresh_environment(), SCALE_DATA=str(data_root), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")


def run_train(
    data_root: Path,
    run_dir: Path,
    overrides: list[str],
    nproc: int = 2,
    fault: str | None = None,
    recipe: str = "demo/dino_tiny",
    timeout: int = 600,  # a guard against a hung run: a loaded 2-core machine took over 300 s for one launch
    fork: bool = True,
) -> subprocess.CompletedProcess:
    """`scale train recipe *overrides --run-dir run_dir --nproc nproc`. `fork`: the launcher forked from the
    worker's preloaded fork server (tests/fork_server.py) and the ranks from the launcher (FORKED_RANKS), which
    saves each of them its imports; False for the tests of the launcher and of process start-up, which run the
    launcher and the ranks as a user's launch does, each a new interpreter."""
    env = clean_env(data_root)
    if fault:
        env["SCALE_FAULT"] = fault
    args = ["train", recipe, *overrides, "--run-dir", str(run_dir), "--nproc", str(nproc)]
    return run_scale(args, env, fork=fork, timeout=timeout)


def run_scale(args: list[str], env: dict, fork: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    """`scale ARGS` with `env`, its output captured. `fork`: forked from the worker's preloaded fork server, the
    ranks from the launcher (FORKED_RANKS); False: new interpreters, as a user's launch starts them."""
    cmd = [sys.executable, *([str(FORKED_RANKS)] if fork else ["-m", "scale.cli"]), *args]
    launch = fork_server.run if fork else subprocess.run
    return launch(cmd, env=env, capture_output=True, text=True, timeout=timeout)

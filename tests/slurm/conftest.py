"""The Slurm test cluster: installed and started by start_cluster.sh when it is not already running."""

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
START = HERE / "start_cluster.sh"


def _unavailable(message: str) -> None:
    """On CI a missing cluster is a failure; on a developer's machine the Slurm tests may be skipped."""
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A one-node Slurm cluster on localhost (2 CPUs), installed with apt and started when not already up."""
    if os.geteuid() != 0:
        _unavailable("the Slurm tests install and start a local cluster and need root")
    try:
        out = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{START} did not finish within 15 minutes", pytrace=False)
    if out.returncode == 10:
        _unavailable(
            f"cannot install slurm-wlm and munge with apt-get (is the Debian archive reachable?):\n"
            f"{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    if out.returncode != 0:
        pytest.fail(
            f"{START} failed (status {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}", pytrace=False
        )

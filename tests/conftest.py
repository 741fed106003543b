"""Shared test set-up: one thread per process (the machine has 2 cores and tests spawn process pairs), and the
embedded data sets, built once per session."""

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
# every Python process a test starts prints its threads' stacks when it dies of a fatal signal
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def embedded_data(tmp_path_factory) -> Path:
    """SCALE_DATA root with the embedded digits and photos shards (root/embedded/NAME/{train,val}), built once per
    test session and shared: tests read it, and write only beside it (a fixture imported into several modules
    would be one fixture per module, built once per module)."""
    from scale.data.embedded import build

    root = tmp_path_factory.mktemp("data")
    for name in ("digits", "photos"):
        build(name, root / "embedded" / name)
    return root

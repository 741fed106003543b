"""The GPU tests (`make test-gpu`): marked `gpu` (one CUDA device) and also `multigpu` (two), skipped with a
one-line reason where the devices are missing, so that `make test` collects them everywhere."""

import sys
from pathlib import Path

import pytest

# the CPU tests' helpers (engine_toy, engine_real), imported as tests/engine's own modules import them
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))

from gpu_env import DEVICE, device_count  # noqa: E402


def pytest_runtest_setup(item):
    count = device_count()
    if item.get_closest_marker("gpu") and count < 1:
        pytest.skip("no CUDA device")
    if item.get_closest_marker("multigpu") and count < 2:
        pytest.skip("needs 2 CUDA devices")


@pytest.fixture(scope="module")
def group():
    """One process's group and device, as the training entry builds them (the in-process Trainer and step tests),
    on the GPU tests' device (tests/conftest.py's is gloo on the CPU)."""
    from scale.engine.dist import shutdown
    from scale.engine.parallel import init_parallel

    info, device = init_parallel()
    assert device.type == DEVICE
    yield info, device
    shutdown()

"""A pytest plugin (`-p devicecheck.collected`) for the device check's tests stage: each pytest process (every xdist
worker collects the whole selection) writes the node ids it selected and deselected to
$SCALE_DEVICE_CHECK_COLLECTED/<worker>.json, so that the check can name every test that never reported (the
stage's limit cut it, or a worker died) and count what the marker expression left out. It also puts the slowest
tests first, so that the workers (`--dist worksteal`) end together rather than one of them on a long test."""

import json
import os
from pathlib import Path

_deselected: list[str] = []
# seconds per test on an H200 (device check, 2026-11-28), the slowest first; what is not named runs after them
SLOWEST_FIRST = {
    "test_gpu_checkpoint.py::test_checkpoint_moves_between_gpu_and_cpu_bit_exact[zero": 66,  # DeepSpeed, 3 spawns
    "test_gpu_bench_demo.py::test_demo": 57,
    "test_gpu_engines.py::test_compiled": 52,  # the compiled runs' fixture
    "test_gpu_compile.py::test_compiled_bf16": 44,
    "test_gpu_cuda_graphs.py": 42,  # two inductor compiles of the demo DINO per case
    "test_gpu_engines.py::test_mixed": 43,
    "test_gpu_engines.py::test_fp32": 43,
    "test_gpu_checkpoint.py": 30,
    "test_gpu_swin.py": 25,
    "test_gpu_bench_demo.py": 22,
}


def seconds(nodeid: str) -> int:
    return next((s for prefix, s in SLOWEST_FIRST.items() if nodeid.split("/")[-1].startswith(prefix)), 0)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -seconds(item.nodeid))  # stable: collection order among equals


def pytest_deselected(items):
    _deselected.extend(item.nodeid for item in items)


def pytest_collection_finish(session):
    folder = os.environ.get("SCALE_DEVICE_CHECK_COLLECTED")
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    data = {"selected": [item.nodeid for item in session.items], "deselected": _deselected}
    (Path(folder) / f"{worker}.json").write_text(json.dumps(data))

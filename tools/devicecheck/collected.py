"""A pytest plugin (`-p devicecheck.collected`) for the device check's tests stage: each pytest process (every xdist
worker collects the whole selection) writes the node ids it selected and deselected to
$SCALE_DEVICE_CHECK_COLLECTED/<worker>.json, so that the check can name every test that never reported (the
stage's limit cut it, or a worker died) and count what the marker expression left out."""

import json
import os
from pathlib import Path

_deselected: list[str] = []


def pytest_deselected(items):
    _deselected.extend(item.nodeid for item in items)


def pytest_collection_finish(session):
    folder = os.environ.get("SCALE_DEVICE_CHECK_COLLECTED")
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    data = {"selected": [item.nodeid for item in session.items], "deselected": _deselected}
    (Path(folder) / f"{worker}.json").write_text(json.dumps(data))

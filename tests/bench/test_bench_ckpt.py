"""`scale bench ckpt` reports what the runs' checkpoints really were: count, size, save time and stall."""

import pytest

from scale.bench.checkpoint import measure, table
from tests.helpers_run import TINY

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def test_checkpoint_benchmark_sync_vs_async(embedded_data, monkeypatch):
    monkeypatch.setenv("SCALE_DATA", str(embedded_data))
    rows = measure("demo/dino_tiny", TINY, steps=4, every=2, nproc=1)
    assert [r["mode"] for r in rows] == ["sync", "async"]
    for row in rows:
        assert row["checkpoints"] == 2 and row["mib"] > 0 and row["step_s"] > 0
    sync, asynchronous = rows
    assert sync["stall_s"] == sync["save_s"]  # a synchronous save stalls training for all of it
    assert asynchronous["stall_s"] <= asynchronous["save_s"]
    assert abs(sync["mib"] - asynchronous["mib"]) / sync["mib"] < 0.05  # the same state either way
    assert "async" in table(rows)

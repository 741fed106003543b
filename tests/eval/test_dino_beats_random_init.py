"""Issue #10: the teacher of a short DINO run beats the same architecture at random initialisation in k-NN accuracy
on the embedded digits. The run is the demo recipe at a quarter of its compute (660 steps at batch 32, one process,
about two minutes)."""

import pytest

from scale.checkpoint.export import export
from scale.demo import knn_of
from tests.helpers_run import run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

MARGIN = 5.0  # k-NN top-1 points; measured here: 40.3% at random init -> 47.8% after these 660 steps
OVERRIDES = ["train.epochs=15", "train.global_batch=32"]


def test_short_dino_run_beats_random_init_by_margin(embedded_data, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALE_DATA", str(embedded_data))
    run = tmp_path / "run"
    done = run_train(embedded_data, run, OVERRIDES, nproc=1, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    before = knn_of("demo/dino_tiny", OVERRIDES, None, tmp_path / "before.json")
    weights = export(run, "teacher-backbone", "safetensors", tmp_path / "teacher.safetensors")
    after = knn_of("demo/dino_tiny", OVERRIDES, str(weights), tmp_path / "after.json")
    assert before["k"] == after["k"] == 20
    assert after["top1"] >= before["top1"] + MARGIN, (before["top1"], after["top1"])

"""A full disk is a clear stop: the run stops before the checkpoint that would not fit, exit 2 and one message
naming the run directory, the space needed and the newest intact checkpoint; a start-up without room for the next
checkpoint is refused the same way; with space back, the run continues from that checkpoint as if never stopped.
The full disk is simulated (SCALE_FAULT=disk_full@STEP: no free space reported at that step, 0 = start-up)."""

import pytest

from scale.faults import spec
from tests.checkpoint.runs import OVERRIDES, assert_same_state, final_state
from tests.helpers_run import run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def test_full_disk_stops_cleanly_and_the_run_continues_once_space_is_back(embedded_data, reference, tmp_path):
    stopped = run_train(embedded_data, tmp_path, OVERRIDES, fault=spec("disk_full", 4))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    err = stopped.stderr
    assert err.count("scale: error:") == 1 and "Traceback" not in err, err[-3000:]
    assert f"run directory {tmp_path}: disk full: the next checkpoint needs about" in err, err[-3000:]
    assert f"newest intact checkpoint is {tmp_path / 'checkpoints' / 'step_000000002'}" in err
    assert not (tmp_path / "checkpoints" / "step_000000004").exists()

    refused = run_train(embedded_data, tmp_path, OVERRIDES, fault=spec("disk_full", 0))
    assert refused.returncode == 2 and refused.stderr.count("disk full") == 1, refused.stderr[-3000:]
    assert "[rank" not in refused.stderr  # refused before any rank started

    resumed = run_train(embedded_data, tmp_path, OVERRIDES)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step_000000002 at step 2" in resumed.stderr
    assert_same_state(final_state(reference), final_state(tmp_path))


def test_a_fresh_runs_first_checkpoint_is_checked_against_its_weights(embedded_data, tmp_path):
    """No checkpoint saved yet, so no size to compare with: the model's weights are the least the first one takes."""
    stopped = run_train(embedded_data, tmp_path, OVERRIDES, fault=spec("disk_full", 2))
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    err = stopped.stderr
    assert err.count("scale: error:") == 1 and "Traceback" not in err, err[-3000:]
    assert "(at least the model's weights: the first checkpoint)" in err and "is none;" in err, err[-3000:]
    assert not list((tmp_path / "checkpoints").glob("*step_*"))


def test_weights_bytes_counts_every_parameter_and_buffer():
    import torch
    from torch import nn

    from scale.loop.diskspace import weights_bytes

    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))  # 16 + 8 parameters, 4 + 4 + 1 buffer values
    assert weights_bytes(net, None) == (16 + 8 + 8) * 4 + 8  # num_batches_tracked is int64
    assert weights_bytes(nn.Linear(2, 2, dtype=torch.float64)) == 6 * 8

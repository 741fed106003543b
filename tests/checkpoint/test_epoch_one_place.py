"""`scale status` and `scale ckpt info` read the epoch from one place: scale.checkpoint.store.epochs_done, which
metrics.jsonl and a checkpoint's meta both record (they disagreed: the last step's epoch index vs steps done //
steps per epoch)."""

import json

import pytest

from scale.checkpoint.export import info
from scale.checkpoint.store import epochs_done
from scale.launch.status import run_status


def test_epochs_done():
    assert epochs_done(0, 10) == 0.0
    assert epochs_done(10, 10) == 1.0  # the last step of epoch 0 done: one epoch
    assert epochs_done(15, 10) == 1.5
    assert epochs_done(3, 0) == 3.0  # no division by zero


@pytest.mark.slow
def test_status_and_ckpt_info_agree_on_the_epoch(reference):
    status = run_status(reference, query_slurm=False)
    checkpoint = info(reference)
    assert checkpoint["step"] == status.step  # the reference's last checkpoint is its last step
    assert checkpoint["epoch"] == status.epoch
    last = json.loads((reference / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["epoch"] == checkpoint["epoch"]

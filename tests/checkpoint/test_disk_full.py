"""A full disk is a clear stop: the run stops before the checkpoint that would not fit, exit 2 and one message
naming the run directory, the space needed and the newest intact checkpoint; a start-up without room for the next
checkpoint is refused the same way; with space back, the run continues from that checkpoint as if never stopped.
The full disk before a save is simulated (SCALE_FAULT=disk_full@STEP: no free space reported at that step, 0 =
start-up); a disk that fills during the write is real to the writer (SCALE_FAULT=disk_fills@STEP:FILE makes FILE a
link to /dev/full, so the kernel answers ENOSPC to whichever rank writes it, inside DCP's, DeepSpeed's or our own
writer)."""

import subprocess

import pytest

from scale.faults import spec
from tests.checkpoint.runs import COMMON, OVERRIDES, assert_same_state, final_state
from tests.helpers_run import run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def test_full_disk_stops_cleanly_and_the_run_continues_once_space_is_back(embedded_data, reference, tmp_path):
    """A full disk found before the save of step 4, then at start-up; the disk then fills inside DCP's write of
    step 4 (DCP gathers every rank's write error: the ranks stop together); with space back, the same command
    continues from step 2 as if never stopped. One run directory for the three stops: each continues from step 2."""
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

    filled = run_train(embedded_data, tmp_path, OVERRIDES, fault=spec("disk_fills", 4, "dcp/__1_0.distcp"))
    assert filled.returncode == 2, filled.stderr[-3000:]
    assert "step_000000002 at step 2" in filled.stderr, filled.stderr[-3000:]
    assert "disk full while writing the checkpoint of step 4 (rank 1: No space left on device)" in filled.stderr

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

    from scale.checkpoint.diskspace import weights_bytes

    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))  # 16 + 8 parameters, 4 + 4 + 1 buffer values
    assert weights_bytes(net, None) == (16 + 8 + 8) * 4 + 8  # num_batches_tracked is int64
    assert weights_bytes(nn.Linear(2, 2, dtype=torch.float64)) == 6 * 8


FOUR = COMMON + ["train.max_steps=4"]  # checkpoints at 2 and 4
DS_ZERO1 = ["engine.kind=deepspeed", "engine.zero_stage=1"]


@pytest.mark.parametrize(
    "extra,step,where,rank",
    [
        ([], 4, "rng/rank1.pt", 1),  # our own file, on rank 1 only, before DCP's collectives
        ([], 4, "meta.json.tmp", 0),  # rank 0's seal, after every rank's files are written
        (["engine.kind=fsdp2", "train.async_save=true"], 2, "dcp/__0_0.distcp", 0),  # found by the next save
        (DS_ZERO1, 4, "engine/state/zero_pp_rank_1_mp_rank_00_optim_states.pt", 1),  # inside DeepSpeed's save
        (DS_ZERO1, 4, "engine/teacher.pt", 0),
    ],
    ids=["own-file-rank1", "seal-rank0", "fsdp2-async-dcp-rank0", "deepspeed-optim-rank1", "deepspeed-teacher"],
)
def test_a_disk_that_fills_during_the_write_stops_every_rank_once(embedded_data, tmp_path, extra, step, where, rank):
    """Whichever rank's write fails, wherever: every rank stops (no rank waits for it in a collective), exit 2, one
    message naming the step, the rank and the error, the partial folder removed, the previous checkpoint intact."""
    stopped = run_train(embedded_data, tmp_path, FOUR + extra, fault=spec("disk_fills", step, where))
    err = stopped.stderr
    assert stopped.returncode == 2, err[-3000:]
    assert err.count("scale: error:") == 1 and "Traceback" not in err, err[-3000:]
    said = f"run directory {tmp_path}: disk full while writing the checkpoint of step {step} (rank {rank}: No space"
    assert said in err, err[-3000:]
    newest = tmp_path / "checkpoints" / "step_000000002" if step == 4 else "none"
    assert f"The newest intact checkpoint is {newest};" in err, err[-3000:]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")), "the partial folder is left"
    assert not (tmp_path / "checkpoints" / f"step_{step:09d}").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A real 2600 KB file system (tmpfs): the tiny run's first checkpoint (about 3.8 MB) passes the check before
    the save (its weights take 1.3 MB) and fills the disk mid-write. Mounting needs root with CAP_SYS_ADMIN (this
    machine and CI have it); elsewhere the test skips, and the /dev/full tests above still run."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2600k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.parametrize(
    "extra",
    [["engine.kind=ddp"], ["engine.kind=fsdp2", "train.async_save=true"], DS_ZERO1],
    ids=["ddp", "fsdp2-async", "deepspeed-zero1"],
)
def test_a_real_file_system_filling_up_mid_checkpoint_stops_the_run_cleanly(embedded_data, small_disk, extra):
    """Every writer at once meets ENOSPC (DCP's, DeepSpeed's with torch's RuntimeError on top, ours, the metrics'),
    as on a cluster's full scratch disk."""
    run_dir = small_disk / "run"
    stopped = run_train(embedded_data, run_dir, FOUR + extra)
    err = stopped.stderr
    assert stopped.returncode == 2, err[-3000:]
    assert err.count("scale: error:") == 1 and "Traceback" not in err, err[-3000:]
    assert f"run directory {run_dir}: disk full while writing the checkpoint of step 2 (" in err, err[-3000:]
    assert "The newest intact checkpoint is none;" in err, err[-3000:]
    assert not list((run_dir / "checkpoints").iterdir()), "the partial folder is left"

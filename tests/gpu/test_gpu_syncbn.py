"""SyncBatchNorm across 2 GPUs (NCCL) normalises with the statistics of the whole batch: the layer alone against
nn.BatchNorm2d on the whole batch on the CPU, and the engines' BatchNorm -> SyncBatchNorm conversion (engine.sync_bn)
under DDP and FSDP2 against the single-process reference loop on the whole batch (tests/engine/engine_toy.py)."""

import pytest
import torch
from engine_toy import reference_run, run_jobs, spawn
from gpu_env import DEVICE, require_cuda
from gpu_jobs import batchnorm_reference, in_fp32, syncbn_job
from test_engine_parity import assert_same_run

pytestmark = [pytest.mark.gpu, pytest.mark.multigpu]


def test_syncbn_statistics_across_two_gpus_equal_one_batch(tmp_path):
    require_cuda("SyncBatchNorm")
    got, ref = spawn(syncbn_job, world=2, tmp_path=tmp_path, device=DEVICE), batchnorm_reference()
    for key, value in ref.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=1e-5, msg=key)


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    require_cuda("SyncBatchNorm")
    jobs = [
        ("ddp_sync", {"kind": "ddp"}, {"clip_grad": 0.0}),
        ("fsdp2_sync", {"kind": "fsdp2"}, {"clip_grad": 0.0}),
        ("ddp_local", {"kind": "ddp", "sync_bn": False}, {"clip_grad": 0.0}),
    ]
    return spawn(in_fp32, run_jobs, jobs, world=2, tmp_path=tmp_path_factory.mktemp("syncbn"), device=DEVICE)


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_engines_convert_batchnorm_to_syncbn(toy_runs, engine):
    # the toy's backbone has a BatchNorm1d: synchronised, 2 ranks see the whole batch's statistics (splits=1)
    assert_same_run(toy_runs[f"{engine}_sync"], reference_run({"clip_grad": 0.0}, splits=1))


def test_sync_bn_off_keeps_per_rank_statistics(toy_runs):
    # and the reference can tell the two apart: without SyncBN each rank normalises its half (splits=2)
    assert_same_run(toy_runs["ddp_local"], reference_run({"clip_grad": 0.0}, splits=2))
    whole, halves = reference_run({"clip_grad": 0.0}, splits=1), reference_run({"clip_grad": 0.0}, splits=2)
    assert abs(whole["losses"][-1] - halves["losses"][-1]) > 1e-3

"""Checkpoints across mesh shapes (4 gloo ranks, FSDP2 through torch.distributed.checkpoint): a run saved on a 2x2
HSDP mesh resumes on 1x4, 4x1 and one rank, and a 1-D 4-rank run resumes on 2x2, each continuing exactly like the
uninterrupted single-process reference (the toy's batch of each step is fixed, so any difference is state). On 4x1
and on one rank the shard group is one rank, so fsdp2 runs as DDP (scale.engine.kinds.runs_as): those resume
FSDP2's checkpoint under DDP."""

import pytest
import torch
from engine_toy import ToyMethod, engine_run, load_and_finish, reference_run, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

SPLIT = 3  # steps before the checkpoint
HSDP_2X2, FLAT_4 = {"kind": "fsdp2", "shard_size": 2}, {"kind": "fsdp2"}
# parameters only: BatchNorm statistics are per rank (no SyncBN on CPU), as in the parity tests
PARAMS = {"student": [n for n, _ in ToyMethod().student.named_parameters()]}
PARAMS["teacher"] = [n for n, _ in ToyMethod().teacher.named_parameters()]
ON_4_RANKS = {"1x4": {"kind": "fsdp2", "shard_size": 4}, "4x1": {"kind": "fsdp2", "shard_size": 1}}


def four_rank_job(folder_2x2: str, folder_flat: str) -> dict:
    saved = {
        "2x2": engine_run(HSDP_2X2, {}, steps=SPLIT, save_to=folder_2x2),
        "flat": engine_run(FLAT_4, {}, steps=SPLIT, save_to=folder_flat),
    }
    resumed = {name: load_and_finish(kw, folder_2x2, SPLIT, saved_world=4) for name, kw in ON_4_RANKS.items()}
    resumed["flat->2x2"] = load_and_finish(HSDP_2X2, folder_flat, SPLIT, saved_world=4)
    return {"saved": saved, "resumed": resumed}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mesh_resume")
    folders = str(tmp / "ckpt_2x2"), str(tmp / "ckpt_flat")
    four = spawn(four_rank_job, *folders, world=4, tmp_path=tmp)
    # one rank accumulating the 4 quarters of each global batch computes what 4 ranks do
    four["resumed"]["1"] = spawn(
        load_and_finish, {"kind": "fsdp2", "grad_accum": 4}, folders[0], SPLIT, 4, world=1, tmp_path=tmp
    )
    return four


@pytest.fixture(scope="module")
def reference():
    return reference_run({"clip_grad": 0.0}, splits=4)


def test_the_saved_runs_match_the_reference(runs, reference):
    for run in runs["saved"].values():
        assert run["losses"] == pytest.approx(reference["losses"][:SPLIT], abs=1e-5)


@pytest.mark.parametrize("shape", ["1x4", "4x1", "1", "flat->2x2"])
def test_resume_on_another_mesh_continues_the_run(runs, reference, shape):
    run = runs["resumed"][shape]
    assert run["losses"] == pytest.approx(reference["losses"][SPLIT:], abs=1e-5)
    for which, names in PARAMS.items():
        for name in names:
            torch.testing.assert_close(run[which][name], reference[which][name], atol=1e-5, rtol=0, msg=name)

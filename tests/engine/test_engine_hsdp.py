"""HSDP on 4 gloo ranks: FSDP2 on the parallel context's 2-D ("replicate", "shard") mesh trains the real DINO and
MoCo v3 exactly like one process over the same global batches (losses within 1e-5 over 5 steps), holds 1/S of the
model per rank, and reports the gradient norm of a 1-D mesh."""

import pytest
import torch
from engine_real import real_jobs
from engine_toy import spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

STEPS = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = [
        ("dino_hsdp", "dino", {"kind": "fsdp2", "shard_size": 2}, 1),
        ("mocov3_hsdp", "mocov3", {"kind": "fsdp2", "shard_size": 2}, 1),
        ("dino_fsdp", "dino", {"kind": "fsdp2"}, 1),  # shard_size 0: one group of 4, the 1-D mesh
    ]
    four = spawn(real_jobs, jobs, STEPS, world=4, tmp_path=tmp_path_factory.mktemp("hsdp"))
    one_jobs = [("dino", "dino", {"kind": "ddp"}, 1), ("mocov3", "mocov3", {"kind": "ddp"}, 1)]
    one = spawn(real_jobs, one_jobs, STEPS, world=1, tmp_path=tmp_path_factory.mktemp("one"))
    return four, one


@pytest.mark.parametrize("kind", ["dino", "mocov3"])
def test_2x2_hsdp_matches_one_process(runs, kind):
    four, one = runs
    hsdp, ref = four[f"{kind}_hsdp"], one[kind]
    assert len(hsdp["losses"]) == STEPS
    assert hsdp["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert ref["losses"][-1] != pytest.approx(ref["losses"][0], abs=1e-4)  # it trains: a wrong step would show
    for name, value in ref["teacher"].items():
        torch.testing.assert_close(hsdp["teacher"][name], value, atol=1e-5, rtol=0, msg=name)


def test_hsdp_rank_holds_1_over_s_of_the_model(runs):
    four, one = runs
    (full,) = one["dino"]["memory"]
    hsdp, fsdp = four["dino_hsdp"]["memory"], four["dino_fsdp"]["memory"]
    for part in ("params", "teacher"):
        # each group of S ranks (0-1 and 2-3 on the 2x2 mesh) holds one whole copy, split without overlap
        assert hsdp[0][part] + hsdp[1][part] == full[part] == hsdp[2][part] + hsdp[3][part], part
        assert sum(rank[part] for rank in fsdp) == full[part], part
    for part in ("params", "teacher", "optimizer"):  # the optimizer's step counters are whole on every rank
        # uneven first dimensions leave a few rows more on low ranks: within 5% of the exact share
        for rank in range(4):
            assert hsdp[rank][part] == pytest.approx(full[part] / 2, rel=0.05), (part, rank)
            assert fsdp[rank][part] == pytest.approx(full[part] / 4, rel=0.05), (part, rank)


def test_gradient_norm_on_2d_mesh_equals_1d(runs):
    four, one = runs
    assert four["dino_hsdp"]["grad_norms"] == pytest.approx(four["dino_fsdp"]["grad_norms"], rel=1e-5)
    assert four["dino_hsdp"]["grad_norms"] == pytest.approx(one["dino"]["grad_norms"], rel=1e-5)

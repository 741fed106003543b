"""The distributed parts of the losses on 2 gloo processes: each rank holds half of the batch, and the results
must equal a single process holding all of it (DINO's center, MoCo's gathered keys with offset labels, SimCLR's
negatives, Sinkhorn-Knopp over the global batch)."""

import pytest
import torch
import torch.distributed as dist

from scale.methods.dino import updated_center
from scale.methods.mocov3 import contrastive
from scale.methods.simclr import nt_xent
from scale.methods.sinkhorn import sinkhorn_knopp
from tests.engine.engine_toy import all_ranks, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def data():
    g = torch.Generator().manual_seed(0)
    return {name: torch.randn(8, 5, generator=g) for name in ("q", "k", "z1", "z2", "teacher", "scores")}


def single_process() -> dict:
    d = data()
    return {
        "center": updated_center(torch.zeros(1, 5), d["teacher"], 0.9),
        "moco": contrastive(d["q"], d["k"], 0.2),
        "simclr": nt_xent(d["z1"], d["z2"], 0.5),
        "sinkhorn": sinkhorn_knopp(d["scores"], 0.5, 3),
    }


def two_rank_job() -> list[dict]:
    rank, group = dist.get_rank(), dist.group.WORLD  # the data-parallel group of 2 ranks
    half = {name: t[rank * 4 : (rank + 1) * 4] for name, t in data().items()}
    return all_ranks(
        {
            "center": updated_center(torch.zeros(1, 5), half["teacher"], 0.9, group),
            "moco": contrastive(half["q"], half["k"], 0.2, group),
            "simclr": nt_xent(half["z1"], half["z2"], 0.5, group),
            "sinkhorn": sinkhorn_knopp(half["scores"], 0.5, 3, group),
        }
    )


def test_two_ranks_equal_one_process(tmp_path):
    ranks = spawn(two_rank_job, tmp_path=tmp_path)
    full = single_process()
    for r in ranks:
        assert torch.allclose(r["center"], full["center"], atol=1e-6)
    # per-rank losses average over their own queries; the mean over ranks is the full-batch loss
    assert torch.allclose((ranks[0]["moco"] + ranks[1]["moco"]) / 2, full["moco"], atol=1e-5)
    assert torch.allclose((ranks[0]["simclr"] + ranks[1]["simclr"]) / 2, full["simclr"], atol=1e-5)
    assert torch.allclose(torch.cat([ranks[0]["sinkhorn"], ranks[1]["sinkhorn"]]), full["sinkhorn"], atol=1e-5)

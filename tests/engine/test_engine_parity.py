"""Parity on 2 gloo processes: DDP and FSDP2 train the toy method like a plain single-process loop over the same
global batches (losses within 1e-4, same student and teacher), with per-parameter and global clipping, gradient
accumulation, a frozen last layer and the shard-local EMA teacher."""

import pytest
import torch
from engine_toy import STEPS, ToyMethod, reference_run, run_jobs, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

PARAM_NAMES = [n for n, _ in ToyMethod().student.named_parameters()]
TEACHER_NAMES = [n for n, _ in ToyMethod().teacher.named_parameters()]


def assert_same_run(run: dict, ref: dict, loss_tol: float = 1e-4, param_tol: float = 1e-5, steps: int = STEPS) -> None:
    assert len(run["losses"]) == steps
    assert run["losses"] == pytest.approx(ref["losses"], abs=loss_tol)
    for name in PARAM_NAMES:
        torch.testing.assert_close(run["student"][name], ref["student"][name], atol=param_tol, rtol=0, msg=name)
    for name in TEACHER_NAMES:
        torch.testing.assert_close(run["teacher"][name], ref["teacher"][name], atol=param_tol, rtol=0, msg=name)


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    jobs = [
        ("ddp_per_param", {"kind": "ddp"}, {"clip_grad": 0.05, "clip_mode": "per_param"}),
        ("fsdp2_per_param", {"kind": "fsdp2"}, {"clip_grad": 0.05, "clip_mode": "per_param"}),
        ("ddp_global", {"kind": "ddp"}, {"clip_grad": 0.1, "clip_mode": "global"}),
        ("fsdp2_global", {"kind": "fsdp2"}, {"clip_grad": 0.1, "clip_mode": "global"}),
        ("fsdp2_accum", {"kind": "fsdp2", "grad_accum": 2}, {"clip_grad": 0.0}),
        ("ddp_lars", {"kind": "ddp"}, {"name": "lars", "lr": 0.05}),
        ("fsdp2_lars", {"kind": "fsdp2"}, {"name": "lars", "lr": 0.05}),
        ("ddp_lamb", {"kind": "ddp"}, {"name": "lamb"}),
        ("fsdp2_lamb", {"kind": "fsdp2"}, {"name": "lamb"}),
    ]
    return spawn(run_jobs, jobs, world=2, tmp_path=tmp_path_factory.mktemp("parity"))


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
@pytest.mark.parametrize("mode,clip", [("per_param", 0.05), ("global", 0.1)])
def test_two_ranks_match_single_process_reference(two_rank_runs, engine, mode, clip):
    ref = reference_run({"clip_grad": clip, "clip_mode": mode})
    assert_same_run(two_rank_runs[f"{engine}_{mode}"], ref)


def test_clipping_is_active_in_the_parity_runs():
    # the clip values above must change the result, or the clipping tests could not fail
    plain, clipped = reference_run({"clip_grad": 0.0}), reference_run({"clip_grad": 0.05, "clip_mode": "per_param"})
    assert abs(plain["losses"][-1] - clipped["losses"][-1]) > 1e-3
    glob = reference_run({"clip_grad": 0.1, "clip_mode": "global"})
    assert abs(glob["losses"][-1] - clipped["losses"][-1]) > 1e-4


def test_gradient_accumulation_over_two_ranks_matches(two_rank_runs):
    # each rank runs 2 micro-batches of 2 images: the reference averages 4 quarters of the global batch
    assert_same_run(two_rank_runs["fsdp2_accum"], reference_run({"clip_grad": 0.0}, splits=4))


def test_frozen_last_layer_is_not_updated_while_frozen(tmp_path):
    from engine_toy import FROZEN_STEPS

    ref0 = reference_run({"clip_grad": 0.0}, steps=0)
    ref_frozen = reference_run({"clip_grad": 0.0}, steps=FROZEN_STEPS)
    ref_after = reference_run({"clip_grad": 0.0}, steps=FROZEN_STEPS + 1)
    name = "head.last_layer.weight"
    assert torch.equal(ref_frozen["student"][name], ref0["student"][name])
    assert not torch.equal(ref_after["student"][name], ref0["student"][name])
    one = spawn(run_jobs, [("ddp", {"kind": "ddp", "grad_accum": 2}, {"clip_grad": 0.0})], world=1, tmp_path=tmp_path)
    # one process accumulating the two halves of each global batch is the 2-rank run
    assert_same_run(one["ddp"], reference_run({"clip_grad": 0.0}, splits=2))


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_trust_ratio_optimizers_see_whole_parameters_on_fsdp2(two_rank_runs, name):
    # LARS/LAMB scale each update by ||w|| / ||update||: on shards these norms must be over the whole tensor,
    # so FSDP2 must train exactly like DDP (whose parameters are whole)
    ddp, fsdp = two_rank_runs[f"ddp_{name}"], two_rank_runs[f"fsdp2_{name}"]
    assert fsdp["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert ddp["losses"][-1] < ddp["losses"][0]
    for name_ in PARAM_NAMES:
        torch.testing.assert_close(fsdp["student"][name_], ddp["student"][name_], atol=1e-5, rtol=0, msg=name_)

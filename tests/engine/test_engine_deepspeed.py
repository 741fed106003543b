"""DeepSpeed ZeRO 1/2/3 on 2 gloo processes (DS_ACCELERATOR=cpu): parity with the single-process reference,
clipping, gradient accumulation, bf16, activation checkpointing, the frozen last layer, the partitioned EMA
teacher, memory per rank and DeepSpeed's own checkpoints (ZeRO-1/2 also resumed on another world size)."""

import pytest
import torch
from engine_toy import (
    FROZEN_STEPS,
    LR,
    ToyMethod,
    engine_run,
    error_of,
    load_and_finish,
    many,
    reference_run,
    resume_job,
    run_jobs,
    spawn,
)
from test_engine_parity import PARAM_NAMES, assert_same_run

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

pytest.importorskip("deepspeed")
NO_FREEZE = {"frozen_steps": 0}  # DeepSpeed's Adam step count is per flat group: compare freezing separately


def zero(stage: int, **kw) -> dict:
    return {"kind": "deepspeed", "zero_stage": stage, **kw}


@pytest.fixture(scope="module")
def one_rank_saves(tmp_path_factory):
    """1 rank, 3 steps with 2 micro-batches (BatchNorm sees the 2-rank run's half batches), saved: the checkpoints
    the 2-rank runs resume (1 -> 2)."""
    tmp = tmp_path_factory.mktemp("one_rank_saves")
    calls = [
        (engine_run, zero(stage, grad_accum=2), {}, 3, 0, None, str(tmp / f"ckpt{stage}"), NO_FREEZE)
        for stage in (1, 2, 3)
    ]
    spawn(many, calls, world=1, tmp_path=tmp)
    return tmp


@pytest.fixture(scope="module")
def ds_runs(tmp_path_factory, one_rank_saves):
    per_param = {"clip_grad": 0.05, "clip_mode": "per_param"}
    jobs = [
        ("z1", zero(1), per_param),
        ("z2", zero(2), per_param),
        ("z3", zero(3), per_param),
        ("z2_global", zero(2), {"clip_grad": 0.1, "clip_mode": "global"}),
        ("z3_global", zero(3), {"clip_grad": 0.1, "clip_mode": "global"}),
        ("z3_accum_ac", zero(3, grad_accum=2, activation_checkpointing="full"), {}),
        ("z3_bf16", zero(3, precision="bf16"), {}),
        ("z1_frozen", zero(1), {}, {"steps": FROZEN_STEPS, "method_kw": {}}),
        ("z3_frozen", zero(3), {}, {"steps": FROZEN_STEPS, "method_kw": {}}),
    ]
    tmp = tmp_path_factory.mktemp("ds")
    calls = [(run_jobs, jobs, {"method_kw": NO_FREEZE})]
    calls += [(resume_job, zero(stage), str(tmp / f"ckpt{stage}"), 3, NO_FREEZE) for stage in (1, 2, 3)]
    # 1 -> 2: the 1-rank checkpoints resumed here; ZeRO-3 refused (last: its failed load is the process's last work)
    calls += [(load_and_finish, zero(stage), str(one_rank_saves / f"ckpt{stage}"), 3, 1, NO_FREEZE) for stage in (1, 2)]
    calls.append((error_of, load_and_finish, zero(3), str(one_rank_saves / "ckpt3"), 3, 1, NO_FREEZE))
    runs, *resumed, grown1, grown2, zero3_error = spawn(many, calls, world=2, tmp_path=tmp)
    return {
        **runs,
        **{f"resumed_z{stage}": run for stage, run in zip((1, 2, 3), resumed)},
        "grown": {1: grown1, 2: grown2, "zero3_error": zero3_error},
        "tmp": tmp,
    }


@pytest.mark.parametrize("label", ["z1", "z2", "z3"])
def test_zero_stages_match_reference_with_per_param_clipping(ds_runs, label):
    assert_same_run(ds_runs[label], reference_run({"clip_grad": 0.05, "clip_mode": "per_param"}, method_kw=NO_FREEZE))


@pytest.mark.parametrize("label", ["z2_global", "z3_global"])
def test_zero_global_clipping_matches_reference(ds_runs, label):
    assert_same_run(ds_runs[label], reference_run({"clip_grad": 0.1, "clip_mode": "global"}, method_kw=NO_FREEZE))


def test_zero3_accumulation_and_checkpointing_match(ds_runs):
    assert_same_run(ds_runs["z3_accum_ac"], reference_run({}, splits=4, method_kw=NO_FREEZE))


def test_zero3_bf16_tracks_fp32(ds_runs):
    ref, run = reference_run({}, method_kw=NO_FREEZE), ds_runs["z3_bf16"]
    assert run["losses"] == pytest.approx(ref["losses"], rel=1e-2)
    for name in PARAM_NAMES:
        diff = (run["student"][name] - ref["student"][name]).abs()
        assert diff.mean() < 2e-3 and diff.max() < 5 * LR, name


@pytest.mark.parametrize("label", ["z1_frozen", "z3_frozen"])
def test_frozen_last_layer_gets_no_update(ds_runs, label):
    # the frozen steps must match the reference exactly, last layer untouched
    run = ds_runs[label]
    assert_same_run(run, reference_run({}, steps=FROZEN_STEPS), steps=FROZEN_STEPS)
    init = reference_run({}, steps=0)["student"]
    for name in ("head.last_layer.weight", "head.last_layer.bias"):
        assert torch.equal(run["student"][name], init[name]), name


def test_zero3_holds_about_half_of_ddp(ds_runs):
    numel = sum(p.numel() for p in ToyMethod().student.parameters())
    teacher_numel = sum(p.numel() for p in ToyMethod().teacher.parameters())
    ddp_total = 4 * numel * 4 + teacher_numel * 4  # params, grads, two Adam moments, teacher (fp32)
    mem = ds_runs["z3"]["memory"]
    assert mem["total"] <= 0.55 * ddp_total + 1024  # + padding of the tiny tensors to even partitions
    assert mem["teacher"] < 0.55 * teacher_numel * 4 + 256
    assert ds_runs["z1"]["memory"]["params"] == numel * 4  # ZeRO-1 replicates the weights


@pytest.mark.parametrize("stage", [1, 3])
def test_native_checkpoint_resumes_exactly(ds_runs, stage):
    # 3 steps, save, a fresh method and engine load and run steps 3..4
    assert_same_run(ds_runs[f"resumed_z{stage}"], reference_run({}, method_kw=NO_FREEZE))
    assert (ds_runs["tmp"] / f"ckpt{stage}" / "state").is_dir()


@pytest.fixture(scope="module")
def one_rank(ds_runs, tmp_path_factory):
    """The 2-rank checkpoints after 3 steps loaded on 1 rank, in one process: ZeRO-1 and ZeRO-2 run steps 3..4 with
    2 micro-batches, ZeRO-3 is refused (last: its failed load is the process's last work)."""
    tmp = ds_runs["tmp"]
    calls = [
        (load_and_finish, zero(stage, grad_accum=2), str(tmp / f"ckpt{stage}"), 3, 2, NO_FREEZE) for stage in (1, 2)
    ]
    calls.append((error_of, load_and_finish, zero(3), str(tmp / "ckpt3"), 3, 2, NO_FREEZE))
    z1, z2, zero3_error = spawn(many, calls, world=1, tmp_path=tmp_path_factory.mktemp("one_rank"))
    return {1: z1, 2: z2, "zero3_error": zero3_error}


def assert_same_moments(run: dict, ref: dict) -> None:
    """Adam's moments of every student parameter after the resumed steps: the uninterrupted run's."""
    assert run["moments"].keys() == ref["moments"].keys()
    for name, moments in ref["moments"].items():
        for key, value in moments.items():
            # float rounding of the 2-rank sums against the halves averaged: 1e-5 of the tensor's largest moment
            tol = 1e-5 * float(value.abs().max())
            torch.testing.assert_close(
                run["moments"][name][key], value, rtol=1e-4, atol=tol, msg=lambda m, at=f"{name} {key}": f"{at}: {m}"
            )


@pytest.mark.parametrize("stage", [1, 2])
def test_native_checkpoint_resumes_on_one_rank(ds_runs, one_rank, stage):
    """2 -> 1: the 2-rank checkpoint after 3 steps, loaded on 1 rank (DeepSpeed's universal format), then steps
    3..4 with 2 micro-batches (BatchNorm sees the same half batches as on 2 ranks): the reference run's weights,
    teacher, losses and optimizer moments."""
    run = {**one_rank[stage], "losses": ds_runs[f"resumed_z{stage}"]["losses"][:3] + one_rank[stage]["losses"]}
    ref = reference_run({}, method_kw=NO_FREEZE)
    assert_same_run(run, ref)
    assert_same_moments(run, ref)
    assert (ds_runs["tmp"] / f"ckpt{stage}" / "universal" / "state" / "zero").is_dir()  # converted once, kept


@pytest.mark.parametrize("stage", [1, 2])
def test_native_checkpoint_resumes_on_two_ranks(ds_runs, one_rank_saves, stage):
    """1 -> 2: the 1-rank checkpoint after 3 steps (2 micro-batches), loaded on 2 ranks, then steps 3..4: the
    reference run's weights, teacher, losses (the mean over the 2 ranks, as the loop logs it) and moments."""
    saved = reference_run({}, steps=3, method_kw=NO_FREEZE)
    run = {**ds_runs["grown"][stage], "losses": saved["losses"] + ds_runs["grown"][stage]["losses"]}
    ref = reference_run({}, method_kw=NO_FREEZE)
    assert_same_run(run, ref)
    assert_same_moments(run, ref)
    assert (one_rank_saves / f"ckpt{stage}" / "universal" / "state" / "zero").is_dir()


def test_zero3_checkpoint_on_another_world_size_is_refused(ds_runs, one_rank):
    """DeepSpeed's universal load of ZeRO-3 restores weights and moments, yet the next update differs: refused
    both ways (2 -> 1 and 1 -> 2), naming both world sizes."""
    assert "ZeRO-3 checkpoint from 2 ranks cannot be resumed exactly on 1" in (one_rank["zero3_error"] or "")
    assert "ZeRO-3 checkpoint from 1 ranks cannot be resumed exactly on 2" in (ds_runs["grown"]["zero3_error"] or "")

"""Engines on 2 gloo processes: the sharded EMA teacher, mixed precision, activation checkpointing, meta-device
init, memory per rank and a DCP checkpoint resumed on another engine and world size."""

import pytest
import torch
from engine_toy import (
    FROZEN_STEPS,
    LR,
    STEPS,
    ema_job,
    engine_run,
    many,
    memory_job,
    meta_job,
    reference_run,
    run_jobs,
    spawn,
)
from test_engine_parity import PARAM_NAMES, TEACHER_NAMES, assert_same_run

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def misc(tmp_path_factory):
    calls = [(ema_job,), (meta_job, "fsdp2"), (meta_job, "ddp"), (memory_job, ["ddp", "fsdp2"], 256)]
    ema, meta_fsdp2, meta_ddp, memory = spawn(many, calls, world=2, tmp_path=tmp_path_factory.mktemp("misc"))
    return {"ema": ema, "meta": {"fsdp2": meta_fsdp2, "ddp": meta_ddp}, "memory": memory}


def test_sharded_ema_teacher_equals_full_tensor_ema(misc):
    out = misc["ema"]
    for rank_shapes in out["shapes"]:  # the teacher's shards line up with the student's on every rank
        for name, shape in rank_shapes["teacher"].items():
            assert shape == rank_shapes["student"][name], name
    assert out["shapes"][0]["teacher"]["backbone.token"] == (1, 16)
    assert out["shapes"][1]["teacher"]["backbone.token"] == (0, 16)  # empty shard on rank 1
    assert out["teacher_sharded_after_forward"] == [True, True]  # gathered teacher parameters were freed
    changed = 0
    for name in TEACHER_NAMES:
        expected = 0.7 * out["teacher"][name] + 0.3 * out["student"][name]
        torch.testing.assert_close(out["teacher_after"][name], expected, atol=1e-6, rtol=0, msg=name)
        changed += not torch.equal(out["teacher"][name], out["student"][name])
    assert changed == len(TEACHER_NAMES)


@pytest.fixture(scope="module")
def variant_runs(tmp_path_factory):
    jobs = [
        ("fsdp2_bf16", {"kind": "fsdp2", "precision": "bf16"}, {}),
        ("ddp_bf16", {"kind": "ddp", "precision": "bf16"}, {}),
        ("fsdp2_ac_full", {"kind": "fsdp2", "activation_checkpointing": "full"}, {}),
        ("ddp_ac_every_2", {"kind": "ddp", "activation_checkpointing": "every_n", "ac_every_n": 2}, {}),
        ("fsdp2_bf16_ac", {"kind": "fsdp2", "precision": "bf16", "activation_checkpointing": "full"}, {}),
    ]
    return spawn(run_jobs, jobs, world=2, tmp_path=tmp_path_factory.mktemp("variants"))


@pytest.mark.parametrize("label", ["fsdp2_ac_full", "ddp_ac_every_2"])
def test_activation_checkpointing_matches_plain_fp32(variant_runs, label):
    assert_same_run(variant_runs[label], reference_run({}))


@pytest.mark.parametrize("label", ["fsdp2_bf16", "ddp_bf16", "fsdp2_bf16_ac"])
def test_bf16_tracks_fp32(variant_runs, label):
    ref, run = reference_run({}), variant_runs[label]
    # bf16 has 8 mantissa bits: losses agree to about 1%. Adam moves each element by about lr per step whatever
    # the gradient's size, so a tiny gradient whose sign flips in bf16 costs up to 2 lr on that element: bound the
    # mean difference tightly and the largest loosely
    assert run["losses"] == pytest.approx(ref["losses"], rel=1e-2)
    for module, names in (("student", PARAM_NAMES), ("teacher", TEACHER_NAMES)):
        for name in names:
            diff = (run[module][name] - ref[module][name]).abs()
            assert diff.mean() < 2e-3 and diff.max() < 5 * LR, (module, name, float(diff.mean()), float(diff.max()))


def test_bf16_fsdp2_and_ddp_agree(variant_runs):
    assert variant_runs["fsdp2_bf16"]["losses"] == pytest.approx(variant_runs["ddp_bf16"]["losses"], rel=1e-2)


@pytest.mark.parametrize("kind", ["fsdp2", "ddp"])
def test_meta_device_init_materialises_after_wrapping(misc, kind):
    out = misc["meta"][kind]
    student, teacher = out["student"], out["teacher"]
    for name in PARAM_NAMES:
        assert torch.isfinite(student[name]).all(), name
    for name in TEACHER_NAMES:  # the teacher starts as a copy of the initialised student
        assert torch.equal(teacher[name], student[name]), name
    # each layer's own init: torch's reset_parameters, the toy backbone's for its token
    assert torch.equal(student["backbone.bn.running_var"], torch.ones(16))
    assert torch.equal(student["backbone.blocks.0.norm.weight"], torch.ones(16))
    bound = 1 / 8**0.5  # nn.Linear(8, 16): uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
    weight = student["backbone.embed.weight"]
    assert weight.abs().max() <= bound and weight.std() > bound / 3
    assert 0 < student["backbone.token"].abs().max() < 0.2
    assert torch.isfinite(torch.tensor(out["loss"]))


def test_fsdp2_holds_about_half_of_ddp_per_rank(misc):
    mem = misc["memory"]
    ddp, fsdp = mem["ddp"], mem["fsdp2"]
    # AdamW: params + grads + 2 moments (+ the teacher), all sharded in two
    assert ddp["optimizer"] == pytest.approx(2 * ddp["params"], rel=1e-3)
    assert ddp["grads"] == ddp["params"]
    assert fsdp["total"] <= 0.55 * ddp["total"]
    assert fsdp["teacher"] <= 0.55 * ddp["teacher"]


def test_dcp_checkpoint_from_fsdp2_two_ranks_resumes_on_ddp_one_rank(tmp_path):
    # saved right after the frozen steps: the last layer has never been stepped, its optimizer state must still
    # be in the checkpoint for the resume to load it
    ckpt = str(tmp_path / "ckpt")
    first = spawn(engine_run, {"kind": "fsdp2"}, {}, FROZEN_STEPS, 0, None, ckpt, world=2, tmp_path=tmp_path)
    rest = spawn(
        engine_run, {"kind": "ddp", "grad_accum": 2}, {}, STEPS, FROZEN_STEPS, ckpt, world=1, tmp_path=tmp_path
    )
    rest["losses"] = first["losses"] + rest["losses"]
    assert_same_run(rest, reference_run({}))

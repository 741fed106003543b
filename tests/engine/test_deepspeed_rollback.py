"""A DeepSpeed load that fails half-way (here: after DeepSpeed loaded the student and the optimizer, reading the
teacher fails) is rolled back like a failed DCP load: no tensor of the failed checkpoint stays in the model, the
fp32 masters or the optimizer, and the engine then loads another checkpoint normally (ZeRO-1 and ZeRO-3, 2 gloo
ranks). The snapshot holds the optimizer's moments by reference (DeepSpeed's load replaces them): no second
copy on the device."""

import errno
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from engine_toy import FROZEN_STEPS, build, context, engine_run, make_batch, shard_batch, spawn

from scale.checkpoint.state import load_engine_files, save_engine_files, tensors_in
from scale.errors import UserError

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

pytest.importorskip("deepspeed")


def state_of(engine) -> dict:
    """Everything a load writes, as CPU copies: the full student and teacher, this rank's fp32 masters and
    optimizer moments, DeepSpeed's step count."""
    zero = engine.ds.optimizer
    masters = getattr(zero, "single_partition_of_fp32_groups", None) or zero.fp32_partitioned_groups_flat
    moments = [
        {k: v.clone() for k, v in state.items() if torch.is_tensor(v)} for state in zero.optimizer.state.values()
    ]
    return {
        "student": engine.export_state_dict("student"),
        "teacher": engine.export_state_dict("teacher"),
        "masters": [m.detach().clone() for m in masters],
        "moments": moments,
        "steps": engine.ds.global_steps,
    }


def one_step(method, engine) -> None:
    rank, world = engine.dist_info.rank, engine.dist_info.world_size
    loss, _ = method.loss(shard_batch(make_batch(0), rank, world), context(FROZEN_STEPS))
    engine.backward(loss)
    engine.step()


def optimizer_state_not_copied(engine) -> list[bool]:
    """Per tensor of the inner optimizer's state: True when the rollback copies none of its memory (it keeps the
    moments by reference; a second copy of them would need their memory twice)."""
    live, _ = engine.rollback_point()
    copied = {t.untyped_storage().data_ptr() for t in tensors_in(live)}
    return [
        value.untyped_storage().data_ptr() not in copied
        for state in engine.ds.optimizer.optimizer.state.values()
        for value in state.values()
        if torch.is_tensor(value)
    ]


def failed_load_job(folder: str) -> dict:
    out = {}
    for stage in (1, 3):
        engine_kw = {"kind": "deepspeed", "zero_stage": stage}
        saved = engine_run(engine_kw, {}, steps=2, save_to=f"{folder}/z{stage}")
        method, engine = build(engine_kw, {})
        one_step(method, engine)  # moments to roll back to
        fresh = state_of(engine)
        no_device_copy = optimizer_state_not_copied(engine)

        error = failing_teacher_load(engine, f"{folder}/z{stage}")
        rolled_back = state_of(engine)
        load_engine_files(engine, f"{folder}/z{stage}", 2)
        out[stage] = {
            "error": error,
            "fresh": fresh,
            "rolled_back": rolled_back,
            "saved": saved,
            "reloaded": state_of(engine),
            "no_device_copy": no_device_copy,
        }
    out["elastic_form"] = elastic_form_job(folder)
    out["full_disk"] = full_disk_conversion_job(folder)
    return out


def failing_teacher_load(engine, folder: str) -> str | None:
    """Load `folder` with the teacher's file unreadable (after DeepSpeed's own load): the error, None if none."""

    def unreadable_teacher(_saved, _source):
        raise RuntimeError("teacher file unreadable")

    engine.load_teacher_state = unreadable_teacher
    try:
        load_engine_files(engine, folder, 2)
    except RuntimeError as err:
        return str(err)
    finally:
        del engine.load_teacher_state
    return None


def elastic_form_job(folder: str) -> dict:
    """ZeRO-1: a checkpoint in DeepSpeed's `elastic_checkpoint` form (its load copies into the live moments), then
    other moments, then a load that fails half-way."""
    method, engine = build({"kind": "deepspeed", "zero_stage": 1}, {})
    one_step(method, engine)
    engine.ds.optimizer.elastic_checkpoint = True  # DeepSpeed's save writes that form
    save_engine_files(engine, f"{folder}/elastic")
    # the step count DeepSpeed records when the optimizer keeps it in its groups (DeepSpeed's own Adam): without
    # it DeepSpeed's load of this form stops before the moments, with torch's optimizers
    for path in Path(f"{folder}/elastic/state").glob(f"zero_pp_rank_{dist.get_rank()}_*optim_states.pt"):
        saved = torch.load(path, weights_only=False)
        saved["optimizer_state_dict"]["base_optimizer_state_step"] = 1
        torch.save(saved, path)
    dist.barrier()
    engine.ds.optimizer.elastic_checkpoint = False  # as scale's engines load
    one_step(method, engine)  # moments to roll back to
    fresh = state_of(engine)
    error = failing_teacher_load(engine, f"{folder}/elastic")
    return {"error": error, "fresh": fresh, "rolled_back": state_of(engine)}


def full_disk_conversion_job(folder: str) -> str:
    """ZeRO-1 resumed on another number of ranks while the disk is full: rank 0's conversion to the universal
    form fails. Each rank's outcome (rank 1's through a file: no collective may follow a rank left waiting); the
    process group's timeout (2 minutes) ends a wait."""
    from scale.engine import deepspeed as ds_engine

    method, engine = build({"kind": "deepspeed", "zero_stage": 1}, {})
    convert = ds_engine.convert_to_universal

    def full_disk(_source, target):
        target.mkdir(parents=True)
        (target / "part").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    ds_engine.convert_to_universal = full_disk
    try:
        load_engine_files(engine, f"{folder}/z1", 1)  # saved by 2 ranks; said to be 1: an elastic resume
        outcome = "loaded"
    except UserError as err:
        outcome = f"UserError: {err}"
    except SystemExit as err:
        outcome = f"SystemExit {err.code}"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    finally:
        ds_engine.convert_to_universal = convert
    rank, outcomes = dist.get_rank(), Path(folder) / "outcomes"
    outcomes.mkdir(exist_ok=True)
    (outcomes / f"rank{rank}").write_text(outcome)
    deadline = time.monotonic() + 300
    while rank == 0 and not (outcomes / "rank1").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = sorted(p.name for p in Path(f"{folder}/z1").iterdir())
    return {"rank0": outcome, "rank1": (outcomes / "rank1").read_text() if rank == 0 else "", "left": left}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_rollback")
    return spawn(failed_load_job, str(tmp), world=2, tmp_path=tmp)


@pytest.mark.parametrize("stage", [1, 3])
def test_a_failed_deepspeed_load_leaves_no_tensor_of_the_checkpoint(results, stage):
    run = results[stage]
    assert run["error"] == "teacher file unreadable"
    assert not same(run["fresh"]["student"], run["saved"]["student"])  # the load had something to undo
    assert run["fresh"]["moments"] and not same(run["fresh"]["moments"], run["reloaded"]["moments"])
    assert same(run["rolled_back"], run["fresh"])


@pytest.mark.parametrize("stage", [1, 3])
def test_after_a_rollback_a_checkpoint_loads_normally(results, stage):
    run = results[stage]
    assert same(run["reloaded"]["student"], run["saved"]["student"])
    assert same(run["reloaded"]["teacher"], run["saved"]["teacher"])
    assert run["reloaded"]["steps"] == 2 and run["reloaded"]["moments"]


@pytest.mark.parametrize("stage", [1, 3])
def test_the_rollback_keeps_no_device_copy_of_the_optimizer_state(results, stage):
    kept = results[stage]["no_device_copy"]
    assert kept and all(kept)


def test_a_failed_load_of_deepspeeds_elastic_checkpoint_form_rolls_the_moments_back(results):
    run = results["elastic_form"]
    assert run["error"] == "teacher file unreadable"
    assert run["fresh"]["moments"] and same(run["rolled_back"], run["fresh"])


def test_a_full_disk_during_the_universal_conversion_stops_every_rank_at_once(results):
    run = results["full_disk"]
    assert run["rank0"].startswith("UserError: ") and "No space left on device" in run["rank0"], run
    assert "nothing was loaded or deleted" in run["rank0"]
    assert run["rank1"] == "SystemExit 2", run  # not the process group's timeout in a barrier
    assert "universal" not in run["left"] and "universal.partial" not in run["left"]  # nothing half-written

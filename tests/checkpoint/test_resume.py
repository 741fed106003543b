"""Exact resume: killed runs (SIGKILL after a step, or inside a checkpoint write) resume to the bit-identical
state of an uninterrupted run, having seen the same samples; FSDP2 checkpoints resume on other world sizes."""

import json

import pytest

from scale.checkpoint.store import resolve
from scale.errors import PREEMPTED_EXIT_CODE
from tests.checkpoint.runs import COMMON, MONITORED, OVERRIDES, STEPS, assert_same_state, final_state, losses, metric
from tests.helpers_run import TINY, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


@pytest.mark.parametrize("fault,extra", [("step@3", []), ("save@4", []), ("step@5", ["train.async_save=true"])])
def test_killed_run_resumes_bit_identical(embedded_data, reference, tmp_path, fault, extra):
    killed = run_train(embedded_data, tmp_path, OVERRIDES + extra, fault=fault)
    assert killed.returncode != 0
    if fault.startswith("save"):  # the interrupted write left no sealed step_4, and step_2 is still the newest
        assert not (tmp_path / "checkpoints" / "step_000000004").exists()
    resumed = run_train(embedded_data, tmp_path, OVERRIDES + extra)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr
    assert_same_state(final_state(reference), final_state(tmp_path))
    ref_losses, our_losses = losses(reference), losses(tmp_path)
    assert all(our_losses[s] == ref_losses[s] for s in our_losses), "a resumed step saw other samples"
    for key in MONITORED:  # metrics.jsonl keeps both attempts' lines: the resumed run's come last
        assert metric(tmp_path, key) == metric(reference, key), key


def test_preemption_signal_checkpoints_and_exits_for_requeue(embedded_data, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    env = dict(os.environ, SCALE_DATA=str(embedded_data), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scale.cli",
            "train",
            "demo/dino_tiny",
            *TINY,
            "train.max_steps=400",
            "--run-dir",
            str(tmp_path),
            "--nproc",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.5)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    folder = resolve(tmp_path)
    step = json.loads((folder / "meta.json").read_text())["step"]
    assert 3 <= step < 400
    resumed = run_train(embedded_data, tmp_path, TINY + [f"train.max_steps={step + 2}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert max(losses(tmp_path)) == step + 2


def test_fsdp2_checkpoint_resumes_on_another_world_size(embedded_data, reference, tmp_path):
    """The demo's fsdp2 recipe saved by FSDP2 on 2 ranks, resumed on one rank, where it runs as DDP
    (scale.engine.kinds.runs_as), then on 4 ranks as FSDP2 again: both engines write and read the same DCP state."""
    import shutil

    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    # the exact reshard on 4 ranks is tests/engine/test_engine_mesh_resume.py's
    saved = final_state(tmp_path)
    out = run_train(embedded_data, tmp_path, OVERRIDES, nproc=1)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stderr and "engine ddp (fsdp2 on one rank)" in out.stderr
    # nothing left to train: the re-saved state is the loaded state, exactly
    assert_same_state(saved, final_state(tmp_path))
    more = run_train(embedded_data, tmp_path, COMMON + [f"train.max_steps={STEPS + 2}"], nproc=1)
    assert more.returncode == 0, more.stderr[-3000:]
    assert "resumed from" in more.stderr and max(losses(tmp_path)) == STEPS + 2
    meta = json.loads((resolve(tmp_path) / "meta.json").read_text())
    assert (meta["engine"], meta["recipe_engine"], meta["world_size"]) == ("ddp", "fsdp2", 1)
    wider = run_train(embedded_data, tmp_path, COMMON + [f"train.max_steps={STEPS + 4}"], nproc=4)
    assert wider.returncode == 0, wider.stderr[-3000:]
    assert "resumed from" in wider.stderr and "engine fsdp2" in wider.stderr and max(losses(tmp_path)) == STEPS + 4
    # the data counters are the whole run's, summed over the ranks, at any world size (rank 0's own were half)
    batch = 16  # TINY's train.global_batch
    assert metric(reference, "data/samples")[STEPS] == STEPS * batch
    assert metric(tmp_path, "data/samples")[STEPS + 4] == (STEPS + 4) * batch


def test_exported_teacher_backbone_loads_into_timm_strictly(reference, tmp_path):
    import timm
    from safetensors.torch import load_file

    from scale.checkpoint.export import export, info

    out = export(reference, "teacher-backbone", "safetensors", tmp_path / "teacher.safetensors")
    # the demo's vit_nano/4 with average pooling, as timm builds it
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=16,
        patch_size=4,
        embed_dim=64,
        depth=3,
        num_heads=4,
        num_classes=0,
        class_token=False,
        global_pool="avg",
        fc_norm=False,
    )
    model.load_state_dict(load_file(str(out)), strict=True)
    summary = info(reference)
    assert summary["step"] == STEPS and summary["world_size"] == 2 and summary["engine"] == "fsdp2"
    assert summary["recipe_engine"] == "fsdp2"  # the recipe's engine.kind, beside the one that ran
    assert summary["teacher_tensors"] > 0 and len(summary["model_checksum"]) == 16

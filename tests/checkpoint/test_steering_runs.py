"""Steering a real run (2 ranks, gloo): a changed fixed setting exits 2 before any rank starts; a checkpoint that
does not fit exits 2 naming the key and both shapes; both leave every checkpoint as it was. train.resume_step rolls
an FSDP2 and a DDP run back bit-identically, keeps the newer checkpoints aside and applies once; train.reset loads
the weights and leaves its parts fresh."""

import shutil

import pytest
import torch
from omegaconf import OmegaConf

from scale.checkpoint.store import SET_ASIDE, step_name
from tests.checkpoint.runs import OVERRIDES, STEPS, assert_same_state, final_state, losses
from tests.helpers_run import run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def inventory(root) -> dict:
    """Every file under a folder with its size and bytes: what 'intact' compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def copy(reference, tmp_path):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    return tmp_path


# one launch for all four: the check names every fixed key that changed, so a key that lost its rule is missing
CHANGES = ["model.img_size=32", "engine.zero_stage=3", "method.dino.norm_last_layer=true", "train.samples_per_epoch=96"]


def test_changed_fixed_settings_exit_2_naming_each_with_every_checkpoint_intact(embedded_data, reference, tmp_path):
    run = copy(reference, tmp_path)
    before, config = inventory(run / "checkpoints"), (run / "config.yaml").read_text()
    out = run_train(embedded_data, run, OVERRIDES + CHANGES)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("fixed on resume") == 1, out.stderr[-3000:]
    for change in CHANGES:
        key = change.split("=")[0]
        assert out.stderr.count(f"{key}: ") == 1, (key, out.stderr[-3000:])
    assert "Traceback" not in out.stderr
    assert inventory(run / "checkpoints") == before and (run / "config.yaml").read_text() == config


def test_a_checkpoint_that_does_not_fit_exits_2_naming_key_and_shapes(embedded_data, reference, tmp_path):
    """A run directory whose config.yaml does not say what wrote its checkpoints (another run's checkpoints):
    the ranks find the shapes differ at load, and stop with one message; nothing is skipped as damaged."""
    run = copy(reference, tmp_path)
    saved = OmegaConf.load(run / "config.yaml")
    saved.model.img_size = 32
    OmegaConf.save(saved, run / "config.yaml")
    before = inventory(run / "checkpoints")
    out = run_train(embedded_data, run, OVERRIDES + ["model.img_size=32"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("does not fit this run") == 1, out.stderr[-3000:]
    assert "engine.student.backbone.pos_embed is [1, 16, 64] in the checkpoint, [1, 64, 64] in this run" in out.stderr
    assert "skipping checkpoint" not in out.stderr and "Traceback" not in out.stderr
    assert inventory(run / "checkpoints") == before


@pytest.fixture(scope="module")
def ddp_reference(embedded_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp_reference")
    out = run_train(embedded_data, run_dir, OVERRIDES + ["engine.kind=ddp"])
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.mark.parametrize("engine", ["fsdp2", "ddp"])
def test_resume_step_rolls_back_exactly_keeps_newer_aside_and_applies_once(
    embedded_data, reference, ddp_reference, tmp_path, engine
):
    ref = {"fsdp2": reference, "ddp": ddp_reference}[engine]
    overrides = OVERRIDES + [f"engine.kind={engine}", "train.resume_step=2"]
    run = copy(ref, tmp_path)
    newer = {s: inventory(run / "checkpoints" / step_name(s)) for s in (4, STEPS)}
    out = run_train(embedded_data, run, overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{step_name(2)} at step 2" in out.stderr, out.stderr[-3000:]
    # the retrained steps 3..6 are the uninterrupted run's, exactly
    assert_same_state(final_state(ref), final_state(run))
    ref_losses = losses(ref)
    assert all(loss == ref_losses[s] for s, loss in losses(run).items())
    (aside,) = (run / "checkpoints" / SET_ASIDE).iterdir()
    assert {s: inventory(aside / step_name(s)) for s in (4, STEPS)} == newer, "a set-aside checkpoint changed"
    if engine == "fsdp2":  # applied once: rank 0's record in the store, whatever the engine; one engine checks it
        again = run_train(embedded_data, run, overrides)  # a requeue with the same recipe: no second rollback
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"{step_name(STEPS)} at step {STEPS}" in again.stderr and "were applied" in again.stderr
        assert len(list((run / "checkpoints" / SET_ASIDE).iterdir())) == 1


def test_reset_optimizer_loads_the_weights_with_fresh_moments(embedded_data, reference, tmp_path):
    run = copy(reference, tmp_path)
    out = run_train(embedded_data, run, OVERRIDES + ["train.resume_step=4", "train.reset=[optimizer]"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fresh optimizer state" in out.stderr and f"{step_name(4)} at step 4" in out.stderr
    ref_loss, our_loss = losses(reference), losses(run)
    assert our_loss[5] == ref_loss[5]  # step 5 starts from step 4's weights
    ours, theirs = final_state(run), final_state(reference)
    moments = [k for k in ours if "optimizer" in k and "exp_avg_sq" in k]
    assert moments and any(not torch.equal(ours[k], theirs[k]) for k in moments)


def test_reset_data_schedules_and_ema_restart_them_from_the_saved_weights(embedded_data, reference, tmp_path):
    run = copy(reference, tmp_path)
    out = run_train(embedded_data, run, OVERRIDES[:-1] + ["train.max_steps=2", "train.reset=[data,schedules,ema]"])
    assert out.returncode == 0, out.stderr[-3000:]
    for said in ("loader starts at sample 0", "step count restarts at 0", "teacher restarts as a copy"):
        assert said in out.stderr, said
    # the step count restarted: steps 1..2 trained again, every earlier checkpoint kept aside
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == [step_name(2)]
    (aside,) = (run / "checkpoints" / SET_ASIDE).iterdir()
    assert sorted(p.name for p in aside.iterdir()) == [step_name(s) for s in (2, 4, STEPS)]


def test_deepspeed_run_rolls_back_with_fresh_optimizer_and_exports_for_timm(embedded_data, tmp_path):
    """ZeRO-2: train.resume_step with train.reset=[optimizer] loads the weights through DeepSpeed without its
    optimizer states; the teacher backbone exports to a folder timm loads strictly."""
    pytest.importorskip("deepspeed")
    import timm

    from scale.checkpoint.export import export

    ds = OVERRIDES[:-1] + ["engine.kind=deepspeed", "engine.zero_stage=2", "train.max_steps=4"]
    first = run_train(embedded_data, tmp_path, ds)
    assert first.returncode == 0, first.stderr[-3000:]
    out = run_train(embedded_data, tmp_path, ds + ["train.resume_step=2", "train.reset=[optimizer]"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"{step_name(2)} at step 2" in out.stderr and "fresh optimizer state" in out.stderr
    (aside,) = (tmp_path / "checkpoints" / SET_ASIDE).iterdir()
    assert [p.name for p in aside.iterdir()] == [step_name(4)]
    folder = export(tmp_path, "teacher-backbone", "timm", tmp_path / "export")
    model = timm.create_model(f"local-dir:{folder}", pretrained=True)
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 64)


def test_resume_step_without_that_checkpoint_exits_2_once(embedded_data, reference, tmp_path):
    run = copy(reference, tmp_path)
    before = inventory(run / "checkpoints")
    out = run_train(embedded_data, run, OVERRIDES + ["train.resume_step=5"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("train.resume_step=5: no sealed checkpoint") == 1 and "sealed: [6, 4, 2]" in out.stderr
    assert "Traceback" not in out.stderr and inventory(run / "checkpoints") == before

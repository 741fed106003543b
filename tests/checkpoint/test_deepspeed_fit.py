"""A DeepSpeed checkpoint that does not fit the run that resumes it (ZeRO-1 and ZeRO-3, 2 ranks) is a user error
naming the key and both shapes, as for DCP: exit 2, one message, no traceback, every checkpoint as it was."""

import shutil

import pytest
from omegaconf import OmegaConf

from tests.checkpoint.test_steering_runs import inventory
from tests.helpers_run import TINY, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def ds(stage: int) -> list[str]:
    return TINY + ["engine.kind=deepspeed", f"engine.zero_stage={stage}", "train.ckpt_every_steps=2"]


@pytest.fixture(scope="module", params=[1, 3])
def ds_run(request, embedded_data, tmp_path_factory):
    pytest.importorskip("deepspeed")
    run = tmp_path_factory.mktemp(f"zero{request.param}")
    out = run_train(embedded_data, run, ds(request.param) + ["train.max_steps=2"])
    assert out.returncode == 0, out.stderr[-3000:]
    return request.param, run


def test_a_deepspeed_checkpoint_that_does_not_fit_exits_2_naming_key_and_shapes(embedded_data, ds_run, tmp_path):
    """Another run's checkpoints in the run directory (config.yaml says img_size 32, the checkpoint holds 16)."""
    stage, reference = ds_run
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    saved = OmegaConf.load(run / "config.yaml")
    saved.model.img_size = 32
    OmegaConf.save(saved, run / "config.yaml")
    before = inventory(run / "checkpoints")
    out = run_train(embedded_data, run, ds(stage) + ["train.max_steps=4", "model.img_size=32"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("does not fit this run") == 1, out.stderr[-3000:]
    assert "engine.student.backbone.pos_embed is [1, 16, 64] in the checkpoint, [1, 64, 64] in this run" in out.stderr
    assert "skipping checkpoint" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert inventory(run / "checkpoints") == before

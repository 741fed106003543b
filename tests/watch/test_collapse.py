"""The collapse alarm: a DINO run forced into collapse (its heads' last layer zeroed: every output, the teacher's
targets and the student's, is uniform, and the gradient of the loss is 0, so it stays there) warns once after the
window, or stops with a named reason under train.stop_on_collapse; a healthy run of the same length does not."""

import math

import pytest
import torch

from scale.config import load_recipe
from scale.loop.rundir import RunDir
from scale.loop.train import Trainer
from scale.watch.collapse import RepresentationCollapse, regime

pytestmark = pytest.mark.slow  # a process group and a training run

STEPS = 6
# 16 images per step and 1437 training digits: 89 steps per epoch; the window is 3 steps
TINY = [
    "train.global_batch=16",
    "train.log_every=1",
    f"train.max_steps={STEPS}",
    "train.collapse.window_epochs=0.034",
    "train.trackers=[]",
    "method.dino.out_dim=64",
    "method.dino.hidden_dim=32",
    "method.dino.bottleneck_dim=16",
    "engine.kind=ddp",
]


def trainer(group, run_dir, overrides=(), collapsed=False) -> Trainer:
    info, device = group
    cfg = load_recipe("demo/dino_tiny", [*TINY, *overrides])
    trained = Trainer(cfg, RunDir(run_dir), info, device)
    if collapsed:
        with torch.no_grad():
            for net in (trained.method.student, trained.method.teacher):
                for name, param in net.named_parameters():
                    if name.endswith("last_layer.weight_g"):
                        param.zero_()
    return trained


def alarms(run_dir) -> list[str]:
    """The alarm's lines in rank 0's log (the loop's logging set-up replaces pytest's capture)."""
    return [
        line for line in (run_dir / "logs" / "rank0.log").read_text().splitlines() if "scale.watch.collapse" in line
    ]


def test_a_forced_collapse_warns_once_after_the_window(group, tmp_path, embedded_data, monkeypatch):
    monkeypatch.setenv("SCALE_DATA", str(embedded_data))
    run = trainer(group, tmp_path / "collapsed", collapsed=True)
    assert run.collapse.window == 3
    assert run.fit() == 0
    warnings = alarms(tmp_path / "collapsed")
    assert len(warnings) == 1, warnings
    assert "WARNING scale.watch.collapse: representation collapse since step 1 (for 3 steps, window 3)" in warnings[0]
    assert "uniform teacher output (entropy -> log K" in warnings[0]

    assert trainer(group, tmp_path / "healthy").fit() == 0
    assert not alarms(tmp_path / "healthy")


def test_stop_on_collapse_stops_with_a_named_reason(group, tmp_path, embedded_data, monkeypatch):
    monkeypatch.setenv("SCALE_DATA", str(embedded_data))
    run = trainer(group, tmp_path, ["train.stop_on_collapse=true"], collapsed=True)
    with pytest.raises(RepresentationCollapse, match="stopped at step 4: representation collapse since step 1"):
        run.fit()
    assert RepresentationCollapse.exit_code == 1


def test_the_regime_names_the_kind_of_collapse():
    cfg = load_recipe("demo/dino_tiny", []).train.collapse
    k = 256
    dominant = regime({"teacher_student_kl": 0.01, "teacher_entropy": 0.05}, cfg, k)
    uniform = regime({"teacher_student_kl": 0.01, "teacher_entropy": math.log(k) - 0.01}, cfg, k)
    assert "one dimension dominates" in dominant and "uniform teacher output" in uniform
    assert regime({"teacher_student_kl": 3.0, "teacher_entropy": 1.0, "embedding_std": 0.7}, cfg, k) is None
    assert "collapsed to a point" in regime({"embedding_std": 0.01}, cfg, None)

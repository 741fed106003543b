"""In-training validation on CUDA (scale/loop/validation.py's Validation, run by scale/loop/train.py's loop): a supervised
run (tiny ViT on the embedded digits, FSDP2, one process) validates on data.val every epoch and after its last
step on the device, records val_top1/val_top5 in metrics.jsonl and eval/val.json, and its last top-1 is the exported
student's, evaluated directly in fp32 on the CPU, to within 2 images of the val set (a logit near-tie may rank
differently on another device's kernels; TF32 is off)."""

import json

import pytest
import torch
from gpu_env import DEVICE, exact_fp32
from safetensors.torch import load_file

from scale.checkpoint.export import export
from scale.config import load_recipe
from scale.data.evaluation import ShardSamples, eval_views_cfg
from scale.loop.rundir import RunDir
from scale.loop.train import Trainer
from scale.methods import build_method
from tests.loop.test_validation import RECIPE

pytestmark = pytest.mark.gpu

SHORT = ["train.epochs=2", "train.samples_per_epoch=64", "train.log_every=1", "train.val_every_epochs=1"]


@pytest.fixture(scope="module", autouse=True)
def full_fp32():
    exact_fp32()


def test_training_validates_on_the_device_and_records_its_metric(group, embedded_data, tmp_path):
    info, device = group
    root = embedded_data / "embedded"
    recipe = tmp_path / "supervised.yaml"
    recipe.write_text(RECIPE.format(root=root))
    cfg = load_recipe(str(recipe), SHORT)
    run_dir = tmp_path / "run"
    trainer = Trainer(cfg, RunDir(run_dir), info, device)
    assert trainer.validation is not None
    assert all(p.device.type == DEVICE for p in trainer.method.student.parameters())
    assert trainer.fit() == 0

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    validated = [(m["step"], m["val_top1"], m["val_top5"]) for m in metrics if "val_top1" in m]
    assert [step for step, _, _ in validated] == [2, 4]  # every epoch (2 steps); the last one is the last step
    assert all(0 <= top1 <= top5 <= 100 for _, top1, top5 in validated)
    history = json.loads((run_dir / "eval" / "val.json").read_text())["history"]
    assert [h["top1"] for h in history] == [top1 for _, top1, _ in validated]

    student = build_method(cfg, 2, 4).student
    student.load_state_dict(load_file(str(export(run_dir, "student", "safetensors", tmp_path / "student.st"))))
    samples = ShardSamples(root / "digits" / "val", eval_views_cfg(cfg.data.views))
    batch = samples.collate([samples[i] for i in range(len(samples))])
    with torch.no_grad():
        logits = student.eval()(batch.crops[0])["logits"]
    direct = 100.0 * float((logits.argmax(1) == batch.labels).float().mean())
    assert history[-1]["samples"] == len(samples)
    assert history[-1]["top1"] == pytest.approx(direct, abs=2 * 100.0 / len(samples) + 1e-9)

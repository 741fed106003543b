"""Shareable weights out: `scale ckpt export --format timm|hf` writes a folder timm loads strictly (config.json,
model.safetensors, a model card with the recipe, its sources and the measured numbers), also through torch.hub
from the repository's hubconf.py."""

import json
from pathlib import Path

import pytest
import timm
import torch

from scale.checkpoint.export import export
from scale.config import load_recipe
from scale.loop.rundir import RunDir
from scale.models import build_backbone
from tests.checkpoint.test_steering import toy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_dir(tmp_path, request):
    """A run directory: the demo recipe's config.yaml (with the overrides the test names), a sealed checkpoint whose
    teacher backbone is known, and a k-NN result."""
    cfg = load_recipe("demo/dino_tiny", getattr(request, "param", []))
    run = RunDir(tmp_path / "run").create()
    run.write_config(cfg)
    torch.manual_seed(3)
    backbone = {k: v.clone() for k, v in build_backbone(cfg.model).state_dict().items()}
    saver, engine, _ = toy(run.checkpoints, 0.0)
    engine.state = {"teacher": {f"backbone.{k}": v for k, v in backbone.items()}}
    saver.save(5)
    (run.root / "eval").mkdir()
    (run.root / "eval" / "knn.json").write_text(json.dumps({"knn_top1": 71.7, "k": 20}))
    return run.root, backbone


@pytest.mark.parametrize("fmt", ["timm", "hf"])
def test_export_loads_into_timm_strictly_and_through_torch_hub(run_dir, tmp_path, fmt):
    root, backbone = run_dir
    out = export(root, "teacher-backbone", fmt, tmp_path / "export")
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "README.md"}
    model = timm.create_model(f"local-dir:{out}", pretrained=True)  # timm's own strict load
    loaded = model.state_dict()
    assert loaded.keys() == backbone.keys() and all(torch.equal(loaded[k], v) for k, v in backbone.items())
    hub = torch.hub.load(str(REPO), "backbone", path=str(out), source="local")
    assert all(torch.equal(hub.state_dict()[k], v) for k, v in backbone.items())
    x = torch.randn(2, 3, 16, 16)
    assert hub.eval()(x).shape == (2, 64)
    card = (out / "README.md").read_text()
    assert "demo/dino_tiny" in card and '"knn_top1": 71.7' in card and "## Where the settings come from" in card
    assert card.startswith("---\nlibrary_name: timm") == (fmt == "hf")


def test_export_refuses_a_backbone_timm_cannot_rebuild(tmp_path):
    cfg = load_recipe("demo/esvit_tiny")
    run = RunDir(tmp_path / "run").create()
    run.write_config(cfg)
    saver, engine, _ = toy(run.checkpoints, 0.0)
    engine.state = {"teacher": {"backbone.x": torch.zeros(2)}}
    saver.save(1)
    from scale.errors import UserError

    with pytest.raises(UserError, match="not a plain ViT; export with --format safetensors"):
        export(run.root, "teacher-backbone", "timm", tmp_path / "export")


def test_timms_transform_of_a_loaded_export_is_the_runs_eval_transform(run_dir, tmp_path):
    """config.json was timm's vit_base_patch16_224 defaults (224 px, mean/std 0.5, crop_pct 0.9, tag augreg2) for a
    16 px ViT trained with ImageNet's mean/std; model.safetensors was 0600; the card had no license."""
    import io
    import random

    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from scale.data.views import EvalView, normalize

    root, _ = run_dir
    out = export(root, "teacher-backbone", "hf", tmp_path / "export", license="apache-2.0")
    cfg = load_recipe("demo/dino_tiny")
    model = timm.create_model(f"local-dir:{out}", pretrained=True)
    data_cfg = resolve_data_config({}, model=model)
    views = cfg.data.views
    assert data_cfg["input_size"] == (3, views.eval_crop, views.eval_crop)
    assert data_cfg["mean"] == pytest.approx(views.mean) and data_cfg["std"] == pytest.approx(views.std)
    assert data_cfg["interpolation"] == "bicubic"
    image = Image.fromarray(torch.randint(0, 256, (40, 40, 3), dtype=torch.uint8).numpy())
    png = io.BytesIO()
    image.save(png, format="PNG")
    ours = EvalView(views)(png.getvalue(), random.Random(0))[0][0]
    ours = normalize(ours[None], views.mean, views.std)[0]
    theirs = create_transform(**data_cfg)(image)
    assert theirs.shape == ours.shape and torch.allclose(theirs, ours.float(), atol=1e-5)
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.iterdir())
    config = json.loads((out / "config.json").read_text())
    assert (
        config["pretrained_cfg"]["license"] == "apache-2.0" and "license: apache-2.0" in (out / "README.md").read_text()
    )


@pytest.mark.parametrize("run_dir", [["model.layer_scale=1e-5"]], indirect=True)
def test_a_vit_with_layer_scale_exports_for_timm(run_dir, tmp_path):
    root, backbone = run_dir
    assert "blocks.0.ls1.gamma" in backbone
    out = export(root, "teacher-backbone", "timm", tmp_path / "export")
    loaded = timm.create_model(f"local-dir:{out}", pretrained=True).state_dict()
    assert loaded.keys() == backbone.keys() and all(torch.equal(loaded[k], v) for k, v in backbone.items())

"""Public weights in: files in each official layout, built from the key names and shapes the official code writes
(DINO/EsViT main_*.py `student`/`teacher` with `module.`, MoCo v3 main_moco.py `state_dict` with
`module.base_encoder.`/`momentum_encoder.`/`predictor.`, DINOv2's teacher_checkpoint.pth, DRLoc/Swin main.py `model`,
timm and scale exports), load strictly into scale's nets and round-trip exactly; a wrong layout is refused naming
the first unmatched key; each load says what was loaded and what started fresh."""

import argparse

import pytest
import timm
import torch
from safetensors.torch import save_file

from scale.checkpoint.init import load_init_weights, plan
from scale.checkpoint.layouts import read_source
from scale.checkpoint.weights import read_state_dict
from scale.config import load_recipe
from scale.errors import UserError
from scale.methods import build_method


def nets(recipe: str, seed: int, overrides=()) -> dict:
    torch.manual_seed(seed)
    method = build_method(load_recipe(recipe, list(overrides)), 10, 100)
    return {"student": method.student, "teacher": method.teacher}


def state(net) -> dict:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def official_dino(source: dict, region: bool = False) -> dict:
    """main_dino.py / main_esvit.py save_dict: the DDP student's keys carry `module.`; EsViT's region head is
    `head_dense`; with the optimizer, epoch, args (an argparse.Namespace) and the loss's center."""

    def named(sd):
        return {(k.replace("region_head.", "head_dense.") if region else k): v for k, v in sd.items()}

    return {
        "student": {f"module.{k}": v for k, v in named(state(source["student"])).items()},
        "teacher": named(state(source["teacher"])),
        "optimizer": {"state": {}, "param_groups": []},
        "epoch": 100,
        "args": argparse.Namespace(arch="vit_small", patch_size=16, out_dim=65536),
        "dino_loss": {"center": torch.zeros(1, 8)},
    }


def official_moco(source: dict) -> dict:
    """main_moco.py: {epoch, arch, state_dict, optimizer, scaler}; the ViT's `head` is the projector."""

    def encoder(net, prefix):
        return {
            f"module.{prefix}."
            + (f"head.{k[len('projector.') :]}" if k.startswith("projector.") else k[len("backbone.") :]): v
            for k, v in state(net).items()
            if k.startswith(("backbone.", "projector."))
        }

    sd = encoder(source["student"], "base_encoder") | encoder(source["teacher"], "momentum_encoder")
    sd |= {f"module.{k}": v for k, v in state(source["student"]).items() if k.startswith("predictor.")}
    return {"epoch": 300, "arch": "vit_small", "state_dict": sd, "optimizer": {"state": {}, "param_groups": []}}


def assert_loaded(target: dict, source: dict, parts=("student", "teacher")) -> None:
    for part in parts:
        got, want = state(target[part]), state(source[part])
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), part


@pytest.mark.parametrize(
    "recipe,build,layout,evaluated",
    [
        ("demo/dino_tiny", official_dino, "DINO checkpoint", "teacher"),
        ("demo/esvit_tiny", lambda s: official_dino(s, region=True), "EsViT checkpoint", "teacher"),
        # main_lincls.py and convert_to_deit.py read the base encoder, not the momentum encoder
        ("demo/mocov3_tiny", official_moco, "MoCo v3 checkpoint", "student"),
    ],
)
def test_official_training_checkpoints_load_strictly_and_round_trip(tmp_path, caplog, recipe, build, layout, evaluated):
    source = nets(recipe, 1)
    with torch.no_grad():  # a teacher unlike its student (MoCo v3 builds the momentum encoder as a copy)
        for p in source["teacher"].parameters():
            p.add_(1.0)
    path = tmp_path / "checkpoint.pth"
    torch.save(build(source), path)
    assert read_source(path).layout == layout
    fresh = nets(recipe, 2)
    with caplog.at_level("INFO"):
        load_init_weights(fresh, str(path), "all", sharded=False)
    assert_loaded(fresh, source)
    assert "student: loaded backbone, " in caplog.text and layout in caplog.text
    # --what backbone: the backbone the official evaluation reads into both nets, the heads stay as built
    again = nets(recipe, 3)
    heads_before = {k: v for k, v in state(again["student"]).items() if not k.startswith("backbone.")}
    loads, notes = plan(
        read_source(path),
        "backbone",
        {n: {k: tuple(v.shape) for k, v in m.state_dict().items()} for n, m in again.items()},
    )
    assert all(k.startswith("backbone.") for part in loads.values() for k in part)
    assert "fresh:" in notes[0] and "(--what backbone)" in notes[0]
    load_init_weights(again, str(path), "backbone", sharded=False)
    student = state(again["student"])
    backbone = {k: v for k, v in state(source[evaluated]).items() if k.startswith("backbone.")}
    assert all(torch.equal(student[k], v) for k, v in backbone.items())
    assert all(torch.equal(student[k], v) for k, v in heads_before.items())
    # an evaluation's --weights reads the same backbone
    probed = read_state_dict(path)
    assert all(torch.equal(probed[k[len("backbone.") :]], v) for k, v in backbone.items())


def test_dinov2_teacher_checkpoint_loads_its_dino_head_and_says_ibot_is_left_out(tmp_path):
    source = nets("demo/dino_tiny", 1)
    teacher = state(source["teacher"])
    checkpoint = {
        "teacher": {k.replace("head.", "dino_head.", 1) if k.startswith("head.") else k: v for k, v in teacher.items()}
    }
    checkpoint["teacher"]["ibot_head.mlp.0.weight"] = torch.zeros(4, 4)
    path = tmp_path / "teacher_checkpoint.pth"
    torch.save(checkpoint, path)
    fresh = nets("demo/dino_tiny", 2)
    loads, notes = plan(
        read_source(path),
        "teacher",
        {n: {k: tuple(v.shape) for k, v in m.state_dict().items()} for n, m in fresh.items()},
    )
    assert "not loaded: ibot_head (iBOT's patch head: scale has no iBOT loss)" in notes
    load_init_weights(fresh, str(path), "teacher", sharded=False)
    assert_loaded({"teacher": fresh["student"]}, {"teacher": source["teacher"]}, parts=["teacher"])
    # DINOv2's own ViT has LayerScale: a backbone of it is refused, naming the first key scale's ViT lacks
    checkpoint["teacher"]["backbone.blocks.0.ls1.gamma"] = torch.ones(64)
    torch.save(checkpoint, path)
    with pytest.raises(UserError, match=r"the file's backbone.blocks.0.ls1.gamma \[64\] has no place"):
        load_init_weights(nets("demo/dino_tiny", 2), str(path), "teacher", sharded=False)


def test_timm_and_scale_exports_load_the_backbone_and_drop_timms_classifier(tmp_path):
    """The demo's vit_nano/4 with average pooling, as timm builds it (with a 10-class head)."""
    torch.manual_seed(5)
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=16,
        patch_size=4,
        embed_dim=64,
        depth=3,
        num_heads=4,
        num_classes=10,
        class_token=False,
        global_pool="avg",
        fc_norm=False,
    )
    path = tmp_path / "timm.pth"
    torch.save(model.state_dict(), path)
    source = read_source(path)
    assert source.dropped == {"head": "a classifier: the recipe's heads start fresh"}
    fresh = nets("demo/dino_tiny", 2)
    load_init_weights(fresh, str(path), "backbone", sharded=False)
    want = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    for net in fresh.values():
        got = net.backbone.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    export = tmp_path / "export.safetensors"
    save_file({k: v.contiguous() for k, v in want.items()}, str(export))
    assert all(torch.equal(read_state_dict(export)[k], v) for k, v in want.items())
    with pytest.raises(UserError, match="has no student net"):
        load_init_weights(nets("demo/dino_tiny", 2), str(export), "student", sharded=False)


def test_drloc_checkpoint_gives_its_swin_backbone(tmp_path):
    source = nets("demo/drloc_tiny", 1)
    backbone = {k[len("backbone.") :]: v for k, v in state(source["student"]).items() if k.startswith("backbone.")}
    checkpoint = {
        "model": {
            **backbone,
            "head.weight": torch.zeros(10, 8),
            "head.bias": torch.zeros(10),
            "drloc.0.layers.0.weight": torch.zeros(4, 4),
        },
        "optimizer": {"state": {}, "param_groups": []},
        "epoch": 299,
        "max_accuracy": 81.2,
    }
    path = tmp_path / "ckpt_epoch_299.pth"
    torch.save(checkpoint, path)
    got = read_state_dict(path)
    assert got.keys() == backbone.keys() and all(torch.equal(got[k], v) for k, v in backbone.items())


def test_a_wrong_layout_is_refused_naming_the_first_unmatched_key(tmp_path):
    path = tmp_path / "checkpoint.pth"
    torch.save(official_dino(nets("demo/dino_tiny", 1, ["method.dino.out_dim=32"])), path)
    with pytest.raises(UserError, match=r"head.last_layer.weight_g is \[32, 1\] in the file, \[256, 1\] in the recipe"):
        load_init_weights(nets("demo/dino_tiny", 2), str(path), "all", sharded=False)


def test_a_file_that_would_run_code_is_refused(tmp_path):
    class Crafted:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "evil.pth"
    torch.save({"student": {}, "teacher": {}, "args": Crafted()}, path)
    with pytest.raises(UserError, match="refused to load"):
        read_source(path)


def test_a_drloc_checkpoint_with_its_yacs_config_loads_without_yacs_running(tmp_path, monkeypatch):
    """main.py saves `config`, a yacs CfgNode (a dict subclass, nested): its values are read as data, yacs is never
    imported, and a CfgNode that would run code is still refused."""
    import sys
    import types

    class CfgNode(dict):  # pickled as yacs.config.CfgNode, as yacs's own class is
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self.__dict__["__immutable__"] = True

    yacs = types.ModuleType("yacs.config")
    yacs.CfgNode = CfgNode
    CfgNode.__module__, CfgNode.__qualname__ = "yacs.config", "CfgNode"
    monkeypatch.setitem(sys.modules, "yacs", types.ModuleType("yacs"))
    monkeypatch.setitem(sys.modules, "yacs.config", yacs)
    backbone = {k: v for k, v in state(nets("demo/drloc_tiny", 1)["student"]).items() if k.startswith("backbone.")}
    config = CfgNode({"MODEL": CfgNode({"TYPE": "swin", "DROP_PATH_RATE": 0.1}), "DATA": CfgNode({"IMG_SIZE": 224})})
    path = tmp_path / "ckpt_epoch_299.pth"
    torch.save({"model": {k[len("backbone.") :]: v for k, v in backbone.items()}, "config": config}, path)
    monkeypatch.delitem(sys.modules, "yacs.config")  # the reader must not need it
    monkeypatch.delitem(sys.modules, "yacs")
    got = read_state_dict(path)
    assert got.keys() == {k[len("backbone.") :] for k in backbone}
    assert all(torch.equal(got[k[len("backbone.") :]], v) for k, v in backbone.items())
    assert "yacs" not in sys.modules

    class Crafted(CfgNode):
        def __reduce__(self):
            return (print, ("ran",))

    Crafted.__module__, Crafted.__qualname__ = "yacs.config", "CfgNode"
    monkeypatch.setitem(sys.modules, "yacs.config", types.SimpleNamespace(CfgNode=Crafted))
    torch.save({"model": {}, "config": Crafted()}, path)
    monkeypatch.delitem(sys.modules, "yacs.config")
    with pytest.raises(UserError, match="refused to load"):
        read_source(path)


def test_a_dinov2_backbone_with_layerscale_loads_into_a_vit_with_model_layer_scale(tmp_path):
    """DINOv2's released backbones (dinov2_vits14_pretrain.pth): timm's names, LayerScale (`blocks.N.ls1.gamma`,
    `ls2.gamma`) and a `mask_token`. With model.layer_scale the ViT has the same parameters and loads them strictly;
    the mask token is left out, said so; without it the first LayerScale key is refused, saying what to set."""
    with_ls = ["model.layer_scale=1e-5"]
    source = nets("demo/dino_tiny", 1, with_ls)["teacher"].backbone
    backbone = {**state(source), "mask_token": torch.randn(1, 64)}
    assert "blocks.0.ls1.gamma" in backbone and "blocks.2.ls2.gamma" in backbone
    for block in backbone:
        if block.endswith(".gamma"):
            backbone[block] = torch.rand_like(backbone[block])  # trained values, not the initial 1e-5
    path = tmp_path / "dinov2_vits14_pretrain.pth"
    torch.save(backbone, path)
    assert read_source(path).dropped == {"mask_token": "iBOT's masked-patch token: scale has no masked-patch loss"}
    fresh = nets("demo/dino_tiny", 2, with_ls)
    load_init_weights(fresh, str(path), "backbone", sharded=False)
    for net in fresh.values():
        got = net.backbone.state_dict()
        assert got.keys() == backbone.keys() - {"mask_token"}
        assert all(torch.equal(got[k], backbone[k]) for k in got)
    with pytest.raises(UserError, match=r"blocks.0.ls1.gamma \[64\] has no place .*set model.layer_scale"):
        load_init_weights(nets("demo/dino_tiny", 2), str(path), "backbone", sharded=False)

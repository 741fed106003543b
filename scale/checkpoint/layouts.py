"""Weights from the files people have, detected from the file's own keys (no flag names the layout): scale's exports,
timm state dicts and bare backbones (DINO's and DINOv2's released weights), and the official training checkpoints
of DINO and EsViT (`student`/`teacher`, `module.` and `backbone.` prefixes, `head`, EsViT's `head_dense`), MoCo v3
(`state_dict` with `module.base_encoder.`/`module.momentum_encoder.`/`module.predictor.`), DRLoc (`model`: a Swin
with its class head) and DINOv2 (`teacher` with `backbone.`/`dino_head.`/`ibot_head.`).

A file reads as `Source`: per net (student, teacher, or None for a bare backbone) a state dict in the names of
scale's nets (`backbone.*`, `head.*`, `region_head.*`, `projector.*`, `predictor.*`), plus what was left out and
why. Pickle files load with torch's weights_only (argparse.Namespace, the `args` the official DINO/EsViT
checkpoints carry, and DRLoc's yacs `config`, read into an inert dict, are the types allowed besides tensors and
containers): no file runs code.
"""

import argparse
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from scale.checkpoint.safe_load import why_not_loaded
from scale.errors import UserError

WHAT = ("backbone", "student", "teacher", "all")


class YacsConfig:
    """Stands in for yacs's CfgNode, the `config` a DRLoc/Swin checkpoint pickles: each one unpickles as a plain
    OrderedDict of its values (torch's weights_only reader fills only plain dicts), so yacs's own class, and its
    code, is never imported or run."""

    def __new__(cls, *args):
        return OrderedDict()


YacsConfig.__module__, YacsConfig.__qualname__ = "yacs.config", "CfgNode"  # the name the pickle gives
SAFE_TYPES = [argparse.Namespace, YacsConfig]  # besides tensors and containers


@dataclass
class Source:
    layout: str
    nets: dict[str | None, dict[str, torch.Tensor]]  # "student" / "teacher" / None (a bare backbone)
    dropped: dict[str, str] = field(default_factory=dict)  # key prefix -> why it has no counterpart
    # the net whose backbone evaluations and fine-tuning read, as the official code does: DINO's eval_*.py take the
    # teacher (--checkpoint_key teacher); MoCo v3's main_lincls.py and convert_to_deit.py the base encoder
    evaluated: str = "teacher"


def read_file(path: str | Path) -> dict:
    """The file's object: a .safetensors file, or a torch pickle read with weights_only."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        with torch.serialization.safe_globals(SAFE_TYPES):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors and torch raise many types for a bad file
        raise UserError(why_not_loaded(path, err, "cannot read weights")) from None
    if not isinstance(state, dict):
        raise UserError(f"{path}: expected a state dict or a checkpoint dict, found a {type(state).__name__}")
    return state


def _tensors(d: dict) -> dict[str, torch.Tensor]:
    return {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}


def _strip(d: dict, prefix: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix(prefix): v for k, v in _tensors(d).items()}


def _rename(d: dict, renames: dict[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in d.items():
        for old, new in renames.items():
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        out[key] = value
    return out


def _under(d: dict, prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in d.items() if k.startswith(prefix)}


MASK_TOKEN = "mask_token"  # DINOv2's backbone: the token iBOT puts in place of masked patches


def _no_mask_token(sd: dict[str, torch.Tensor], dropped: dict[str, str]) -> dict[str, torch.Tensor]:
    """`sd` without DINOv2's mask token (noted in `dropped`): scale has no masked-patch loss to use it."""
    keys = [k for k in sd if k.rsplit(".", 1)[-1] == MASK_TOKEN]
    if keys:
        dropped[keys[0]] = "iBOT's masked-patch token: scale has no masked-patch loss"
    return {k: v for k, v in sd.items() if k not in keys}


def _dino(state: dict) -> Source:
    """DINO / EsViT main_*.py checkpoint: student (DDP: `module.`), teacher (DDP only for BN backbones)."""
    nets = {
        part: _rename(_strip(state[part], "module."), {"head_dense.": "region_head."})
        for part in ("student", "teacher")
    }
    esvit = any(k.startswith("region_head.") for k in nets["student"])
    return Source("EsViT checkpoint" if esvit else "DINO checkpoint", nets)


def _moco(state: dict) -> Source:
    """MoCo v3 main_moco.py checkpoint: the encoders' classifier slot holds the projector (`head` ViT, `fc` ResNet)."""
    sd = _strip(state["state_dict"], "module.")
    projector = {"head.": "projector.", "fc.": "projector."}

    def encoder(prefix: str) -> dict:
        return {
            (k if k.startswith("projector.") else f"backbone.{k}"): v
            for k, v in _rename(_under(sd, prefix), projector).items()
        }

    student = encoder("base_encoder.") | {f"predictor.{k}": v for k, v in _under(sd, "predictor.").items()}
    # main_lincls.py:180-183 and convert_to_deit.py:26-30 keep `module.base_encoder.` (the student), not the momentum one
    return Source(
        "MoCo v3 checkpoint", {"student": student, "teacher": encoder("momentum_encoder.")}, evaluated="student"
    )


def _dinov2(state: dict) -> Source:
    """DINOv2 eval/training_*/teacher_checkpoint.pth: the teacher with its DINO and iBOT heads."""
    teacher = _rename(_tensors(state["teacher"]), {"dino_head.": "head."})
    dropped = (
        {"ibot_head": "iBOT's patch head: scale has no iBOT loss"}
        if any(k.startswith("ibot_head.") for k in teacher)
        else {}
    )
    teacher = _no_mask_token({k: v for k, v in teacher.items() if not k.startswith("ibot_head.")}, dropped)
    return Source("DINOv2 teacher checkpoint", {"teacher": teacher}, dropped)


def _drloc(state: dict) -> Source:
    """DRLoc / Swin main.py checkpoint: `model` is the backbone with its class head (`head.`) and DRLoc's MLPs."""
    model = _tensors(state["model"])
    backbone = {k: v for k, v in model.items() if not k.startswith(("head.", "drloc"))}
    dropped = {
        k.split(".")[0]: "the official class head and DRLoc MLPs: scale rebuilds them for the recipe"
        for k in model
        if k not in backbone
    }
    return Source("DRLoc/Swin checkpoint", {None: backbone}, dropped)


def _bare(state: dict) -> Source:
    """A backbone state dict: `scale ckpt export`, timm, DINO's and DINOv2's released backbones. A net-level
    export (`--what student`) keeps its `backbone.`/head names; timm's classifier has no counterpart."""
    sd = _strip(state, "module.")
    if any(k.startswith("backbone.") for k in sd):
        return Source("scale net state dict", {"student": sd})
    dropped = {}
    classifier = {k for k in sd if k.startswith(("head.", "fc.")) and k.rsplit(".", 1)[-1] in ("weight", "bias")}
    if classifier and all(k.count(".") == 1 for k in classifier):  # timm's `head.weight` / torchvision's `fc.weight`
        dropped = {sorted(classifier)[0].split(".")[0]: "a classifier: the recipe's heads start fresh"}
        sd = {k: v for k, v in sd.items() if k not in classifier}
    return Source("backbone state dict", {None: _no_mask_token(sd, dropped)}, dropped)


def detect(state: dict) -> Source:
    """The layout of a file's object, from its keys."""
    if isinstance(state.get("student"), dict) and isinstance(state.get("teacher"), dict):
        return _dino(state)
    if isinstance(state.get("state_dict"), dict) and any("base_encoder." in k for k in state["state_dict"]):
        return _moco(state)
    if isinstance(state.get("teacher"), dict):
        return _dinov2(state)
    if isinstance(state.get("model"), dict):
        return _drloc(state)
    if state and all(isinstance(v, torch.Tensor) for v in state.values()):
        return _bare(state)
    raise UserError(
        f"an unknown layout (top-level keys {sorted(map(str, state))[:8]}): expected a state dict, or the official "
        "checkpoint of DINO, EsViT, MoCo v3, DRLoc or DINOv2 (docs/how-to/weights.md)"
    )


def read_source(path: str | Path) -> Source:
    try:
        return detect(read_file(path))
    except UserError as err:
        if str(err).startswith(str(path)):
            raise
        raise UserError(f"{path}: {err}") from None


def backbone_of(source: Source) -> tuple[str, dict[str, torch.Tensor]]:
    """(whose, the backbone's state dict without `backbone.`): the net the official evaluation reads
    (`source.evaluated`) where the file has it."""
    if None in source.nets:
        return "the file's", source.nets[None]
    whose = source.evaluated if source.evaluated in source.nets else next(iter(source.nets))
    return f"the {whose}'s", _under(source.nets[whose], "backbone.")


def net_of(source: Source, whose: str) -> dict[str, torch.Tensor]:
    """The whole net `whose` (student or teacher) in scale's names, or a UserError saying what the file has."""
    if whose not in source.nets:
        has = [n for n in source.nets if n] or ["a backbone only"]
        raise UserError(
            f"the file ({source.layout}) has no {whose} net (it has: {', '.join(has)}): use --what backbone"
        )
    return source.nets[whose]

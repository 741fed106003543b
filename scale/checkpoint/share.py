"""Shareable weights out: `scale ckpt export --format timm|hf` writes a folder that timm loads as it is
(`timm.create_model("local-dir:DIR", pretrained=True)`; the same folder is a Hugging Face Hub repository for
`hf-hub:`): model.safetensors and config.json (timm's architecture, model_args and pretrained_cfg, written by
timm's own save_for_hf; the pretrained_cfg is the run's own evaluation transform, so that timm's resolve_data_config
+ create_transform preprocess as the run evaluated), and README.md, a model card with the recipe, where its settings come from and the run's
measured k-NN / linear numbers. `hf` adds the Hub's metadata header to the card. ViT backbones (scale's ViT is
timm's VisionTransformer); other families export as safetensors."""

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from scale.errors import UserError
from scale.readback import EVAL_RESULT, BadFile, read_json

# a registered timm ViT whose factory the model_args override entirely (timm needs a known architecture name): the
# fallback when timm registers no ViT of the backbone's own width, depth and patch
TIMM_VIT = "vit_base_patch16_224"
TIMM_SIZES = {(192, 12): "tiny", (384, 12): "small", (768, 12): "base", (1024, 24): "large", (1280, 32): "huge"}
LICENSE = "other"  # the weights are the user's: `scale ckpt export --license` names theirs (e.g. apache-2.0)
FILE_MODE = 0o644  # shareable: readable by the group and others (safetensors writes 0600)


def architecture(args: dict) -> str:
    """timm's registered name of the ViT of this width, depth, patch and input size, else TIMM_VIT."""
    import timm

    size = TIMM_SIZES.get((args["embed_dim"], args["depth"]))
    name = f"vit_{size}_patch{args['patch_size']}_{args['img_size']}"
    return name if size and timm.is_model(name) else TIMM_VIT


def pretrained_cfg(cfg, name: str, license: str) -> dict:
    """timm's pretrained_cfg of the export: the run's evaluation transform (scale.data.views.EvalView: the short side
    resized to eval_resize, bicubic, a center crop of eval_crop, the recipe's mean/std), no classifier."""
    views = cfg.data.views
    crop, resize = int(views.eval_crop), int(views.eval_resize)
    return {
        "architecture": name,
        "tag": f"scale-{cfg.meta.name.replace('/', '-')}",
        "input_size": (3, crop, crop),
        "fixed_input_size": False,
        "interpolation": "bicubic",
        "crop_pct": crop / resize,
        "crop_mode": "center",
        "mean": tuple(float(m) for m in views.mean),
        "std": tuple(float(s) for s in views.std),
        "num_classes": 0,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "license": license,
    }


def timm_args(backbone) -> dict:
    """The VisionTransformer arguments that rebuild scale's ViT `backbone` in timm, state dict names included."""
    from scale.models.vit import ViT

    # ViTBlock is timm's Block with its drop-path masks given (same parameters); a subclass of it (ViT-BN) is not
    if not isinstance(backbone, ViT) or any(type(b).__name__ != "ViTBlock" for b in backbone.blocks):
        raise UserError(
            f"--format timm|hf: {type(backbone).__name__} is not a plain ViT; export with --format safetensors "
            "(timm and hf exports: the vit_* backbones, LayerScale included; not vit_bn_*, Swin, ResNet or the "
            "other families, which timm does not rebuild with scale's names)"
        )
    cls = backbone.cls_token is not None
    scale = backbone.blocks[0].ls1
    return {
        "img_size": backbone.patch_embed.img_size[0],
        "patch_size": backbone.patch_embed.patch_size[0],
        "embed_dim": backbone.embed_dim,
        "depth": len(backbone.blocks),
        "num_heads": backbone.blocks[0].attn.num_heads,
        "num_classes": 0,
        "class_token": cls,
        "global_pool": "token" if cls else "avg",
        "fc_norm": False,
        "final_norm": not isinstance(backbone.norm, torch.nn.Identity),
        "pos_embed": "learn" if backbone.pos_embed is not None else "none",
        "dynamic_img_size": True,
        "init_values": getattr(scale, "init_values", None),  # LayerScale (model.layer_scale), else Identity
    }


def _measured(run_dir: Path) -> dict:
    """The run's evaluation results (eval/*.json) that hold a top-1."""
    found = {}
    for path in sorted((run_dir / "eval").glob("*.json")):
        try:
            result = read_json(path, EVAL_RESULT)
        except (OSError, BadFile):
            continue
        top1 = {k: v for k, v in result.items() if "top1" in k and isinstance(v, (int, float))}
        if top1:
            found[path.stem] = top1
    return found


def model_card(cfg, run_dir: Path, step: int, what: str, hub: bool, license: str = LICENSE) -> str:
    meta = cfg.meta
    lines = (
        [
            "---",
            "library_name: timm",
            f"license: {license}",
            "tags: [image-feature-extraction, timm, self-supervised]",
            "---",
            "",
        ]
        if hub
        else []
    )
    lines += [
        f"# {meta.name}: {what} at step {step}",
        "",
        f"Trained with scale, recipe `{meta.name}`"
        + (f" ({meta.paper} {meta.table}, {meta.row})" if meta.paper else ""),
        f"method {cfg.method.kind}, backbone {cfg.model.name}, {cfg.train.epochs} epochs at global batch {cfg.train.global_batch}.",
        f"License: {license}.",
        f"Evaluation transform (timm's `resolve_data_config` + `create_transform` give the same): resize the short "
        f"side to {cfg.data.views.eval_resize} px (bicubic), center crop {cfg.data.views.eval_crop} px, mean "
        f"{list(cfg.data.views.mean)}, std {list(cfg.data.views.std)}.",
        "",
        "```python",
        "import timm",
        'model = timm.create_model("local-dir:PATH_TO_THIS_FOLDER", pretrained=True)  # num_classes=0: features',
        "```",
        "",
        "## Measured",
    ]
    measured = _measured(run_dir)
    lines += [f"- {name}: {json.dumps(values)}" for name, values in measured.items()] or [
        "- no evaluation in the run directory yet (`scale eval knn|linear`)"
    ]
    paper = OmegaConf.to_container(meta.reported) if meta.reported else {}
    if paper:
        lines += ["", "## The paper's numbers for this row", f"{json.dumps(paper)}"]
    sources = OmegaConf.to_container(cfg.sources) if cfg.sources else {}
    if sources:
        lines += ["", "## Where the settings come from"] + [
            f"- `{k}` = {v[0]!r}: {v[1]}" for k, v in sorted(sources.items())
        ]
    return "\n".join(lines) + "\n"


def write_timm(
    tensors: dict[str, torch.Tensor],
    cfg,
    run_dir: Path,
    step: int,
    what: str,
    out: Path,
    hub: bool,
    license: str = LICENSE,
) -> Path:
    """The export folder: weights loaded strictly into timm's model, saved by timm with the run's own
    pretrained_cfg, and the model card; every file 0644."""
    import timm
    from timm.models import save_for_hf

    from scale.models import build_backbone

    args = timm_args(build_backbone(cfg.model, device="meta"))
    name = architecture(args)
    model = timm.create_model(name, pretrained=False, **args)
    model.load_state_dict(tensors, strict=True)
    model.pretrained_cfg = pretrained_cfg(cfg, name, license)
    out.mkdir(parents=True, exist_ok=True)
    save_for_hf(model, str(out), model_args=args, safe_serialization=True)
    (out / "README.md").write_text(model_card(cfg, run_dir, step, what, hub, license))
    for path in out.iterdir():
        path.chmod(FILE_MODE)
    return out


class ExportUnreadable(UserError):
    """A folder that hubconf.py's `backbone` entry point cannot load: the message names the file."""


def load_exported(path, **kwargs):
    """The backbone of an exported folder (torch.hub's `backbone` entry point), built by timm from config.json and
    loaded strictly; a folder it cannot load raises ExportUnreadable naming the file and why, never torch's or
    json's own errors (nor torch's advice to load a refused pickle with weights_only=False)."""
    import timm

    from scale.checkpoint.safe_load import why_not_loaded

    folder = Path(path)
    config = folder / "config.json"
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        reason = err.strerror if isinstance(err, OSError) else f"{type(err).__name__}: {err}"
        raise ExportUnreadable(f"{config}: not the config.json of an exported folder ({reason})") from None
    if not isinstance(parsed, dict):
        raise ExportUnreadable(f"{config}: a JSON {type(parsed).__name__}, not the config.json of an exported folder")
    weights = folder / "model.safetensors"  # what `scale ckpt export --format timm|hf` writes
    try:
        return timm.create_model(f"local-dir:{folder}", pretrained=True, **kwargs)
    except Exception as err:  # timm, torch and safetensors raise many types for a bad folder
        raise ExportUnreadable(
            why_not_loaded(weights if weights.is_file() else folder, err, "cannot load it")
        ) from None

"""Shareable weights out: `scale ckpt export --format timm|hf` writes a folder that timm loads as it is
(`timm.create_model("local-dir:DIR", pretrained=True)`; the same folder is a Hugging Face Hub repository for
`hf-hub:`): model.safetensors and config.json (timm's architecture, model_args and pretrained_cfg, written by
timm's own save_for_hf), and README.md, a model card with the recipe, where its settings come from and the run's
measured k-NN / linear numbers. `hf` adds the Hub's metadata header to the card. ViT backbones (scale's ViT is
timm's VisionTransformer); other families export as safetensors."""

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from scale.errors import UserError

# a registered timm ViT whose factory the model_args override entirely (timm needs a known architecture name)
TIMM_VIT = "vit_base_patch16_224"


def timm_args(backbone) -> dict:
    """The VisionTransformer arguments that rebuild scale's ViT `backbone` in timm, state dict names included."""
    from scale.models.vit import ViT

    if not isinstance(backbone, ViT) or any(type(b).__name__ != "Block" for b in backbone.blocks):
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
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(result, dict):
            top1 = {k: v for k, v in result.items() if "top1" in k and isinstance(v, (int, float))}
            if top1:
                found[path.stem] = top1
    return found


def model_card(cfg, run_dir: Path, step: int, what: str, hub: bool) -> str:
    meta = cfg.meta
    lines = (
        ["---", "library_name: timm", "tags: [image-feature-extraction, timm, self-supervised]", "---", ""]
        if hub
        else []
    )
    lines += [
        f"# {meta.name}: {what} at step {step}",
        "",
        f"Trained with scale, recipe `{meta.name}`"
        + (f" ({meta.paper} {meta.table}, {meta.row})" if meta.paper else ""),
        f"method {cfg.method.kind}, backbone {cfg.model.name}, {cfg.train.epochs} epochs at global batch {cfg.train.global_batch}.",
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
    tensors: dict[str, torch.Tensor], cfg, run_dir: Path, step: int, what: str, out: Path, hub: bool
) -> Path:
    """The export folder: weights loaded strictly into timm's model, saved by timm, with the model card."""
    import timm
    from timm.models import save_for_hf

    from scale.models import build_backbone

    args = timm_args(build_backbone(cfg.model, device="meta"))
    model = timm.create_model(TIMM_VIT, pretrained=False, **args)
    model.load_state_dict(tensors, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    save_for_hf(model, str(out), model_args=args, safe_serialization=True)
    (out / "README.md").write_text(model_card(cfg, run_dir, step, what, hub))
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

"""`scale models table`: parameters, multiply-adds and tokens of backbones, counted on the meta device."""

from dataclasses import replace

import torch
from omegaconf import OmegaConf

from scale.config import list_recipes, load_recipe, recipe_name
from scale.errors import UserError
from scale.models.config import ModelConfig
from scale.models.flops import count_macs, count_params
from scale.models.registry import build_backbone

# the four papers' backbones: name[/patch][/wWINDOW][/hHEADS]
PAPER_MODELS = [
    "vit_small/16",
    "vit_small/16/h12",
    "vit_small/8",
    "vit_base/16",
    "vit_base/8",
    "vit_large/16",
    "vit_huge/14",
    "vit_large/7",
    "vit_bn_large/7",
    "vit_bn_huge/14",
    "swin_tiny",
    "swin_small",
    "swin_base",
    "swin_tiny/w14",
    "swin_small/w14",
    "swin_base/w14",
    "resnet50",
]
GLOBAL_PX = 224


def parse_spec(spec: str) -> ModelConfig:
    """'vit_large/7' -> patch 7; 'swin_base/w14' -> window 14; 'vit_small/h12' -> 12 heads."""
    name, *parts = spec.strip().split("/")
    cfg = ModelConfig(name=name)
    for part in parts:
        key, digits = (
            ("window_size", part[1:])
            if part[:1] == "w"
            else ("num_heads", part[1:])
            if part[:1] == "h"
            else ("patch_size", part)
        )
        if not digits.isdigit():
            raise UserError(f"--models: cannot read '{part}' in '{spec}' (use name/PATCH, name/wWINDOW, name/hHEADS)")
        cfg = replace(cfg, **{key: int(digits)})
    return cfg


def spec_of(cfg) -> str:
    """The row label: the spec, plus the MoCo v3 options that change the counts."""
    spec = cfg.name
    if cfg.patch_size is not None:
        spec += f"/{cfg.patch_size}"
    if cfg.name.startswith("swin") and cfg.window_size != 7:
        spec += f"/w{cfg.window_size}"
    if cfg.num_heads is not None:
        spec += f"/h{cfg.num_heads}"
    extras = [cfg.pos_embed + (" trainable" if cfg.pos_embed_trainable else "")] if cfg.pos_embed != "learned" else []
    extras += ["avg-pool"] if cfg.pooling != "cls" else []
    extras += [f"img{cfg.img_size}"] if cfg.img_size != GLOBAL_PX else []
    return spec + (f" ({', '.join(extras)})" if extras else "")


def accepted_px(size: int, patch: int) -> int:
    """The multiple of the patch size nearest to `size`: the crop the recipes use for that patch (224 -> 225 and
    96 -> 95 for /5, 96 -> 98 for /7 and /14)."""
    return patch * max(1, round(size / patch))


def describe(cfg) -> dict:
    """One row: counts of the backbone alone (no heads) at the global and the local crop size, each the multiple of
    the patch size nearest to 224 and 96 px (the row says which: global_px, local_px)."""
    patch = cfg.patch_size or 1
    global_px, local_px = accepted_px(GLOBAL_PX, patch), accepted_px(96, patch)
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg, {"img_size": accepted_px(cfg.img_size, patch)})
    model = build_backbone(cfg, device="meta")
    row = {"model": spec_of(cfg), "params_M": count_params(model) / 1e6}
    for label, size in (("global", global_px), ("local", local_px)):
        grid = model(torch.empty(1, 3, size, size, device="meta"))["grid"]
        row[f"{label}_px"] = size
        row[f"{label}_GMACs"] = count_macs(model, size) / 1e9
        row[f"{label}_tokens"] = f"{grid[0]}x{grid[1]}"
    return row


def _key(cfg) -> tuple:
    """The options that change a backbone's counts (not drop_path, init or freezing)."""
    return (
        cfg.name,
        cfg.patch_size,
        cfg.num_heads,
        cfg.window_size,
        cfg.img_size,
        cfg.pos_embed,
        cfg.pos_embed_trainable,
        cfg.pooling,
        cfg.final_norm,
        cfg.bn_mlp,
    )


def table(specs: list[str] | None = None) -> list[dict]:
    """Rows for `specs`, or for the paper models plus every model a recipe uses (with the recipes' names)."""
    if specs:
        return [describe(parse_spec(s)) for s in specs]
    entries: dict[tuple, tuple] = {}
    for spec in PAPER_MODELS:
        cfg = parse_spec(spec)
        entries[_key(cfg)] = (cfg, [])
    for path in list_recipes():
        cfg = load_recipe(str(path)).model
        entries.setdefault(_key(cfg), (cfg, []))[1].append(recipe_name(path))
    return [dict(describe(cfg), recipes=names) for cfg, names in entries.values()]

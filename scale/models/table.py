"""`scale models table`: parameters, multiply-adds and tokens of backbones, counted on the meta device."""

from collections.abc import Iterator
from dataclasses import replace

import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from scale.config import list_recipes, load_recipe, recipe_name
from scale.errors import UserError
from scale.models.complexity import count_forward, count_params, structure
from scale.models.config import ModelConfig
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
    extras += ["no final norm"] if not cfg.final_norm else []
    extras += [f"img{cfg.img_size}"] if cfg.img_size != GLOBAL_PX else []
    return spec + (f" ({', '.join(extras)})" if extras else "")


def accepted_px(size: int, patch: int) -> int:
    """The multiple of the patch size nearest to `size`: the crop the recipes use for that patch (224 -> 225 and
    96 -> 95 for /5, 96 -> 98 for /7 and /14)."""
    return patch * max(1, round(size / patch))


def build(cfg) -> tuple[ModelConfig, torch.nn.Module]:
    """The backbone `cfg` names on the meta device (nothing allocated), its img_size rounded to the patch, without
    stochastic depth (a training option that counts nothing, and would tell recipes' backbones apart)."""
    patch = cfg.patch_size or 1
    cfg = OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg, {"img_size": accepted_px(cfg.img_size, patch)})
    with SkipInitOnMeta():
        return cfg, build_backbone(cfg, drop_path=0.0, device="meta")


class SkipInitOnMeta(TorchDispatchMode):
    """In-place ops that only write values (an initialisation's normal_, clamp_, mul_, fill_...) return their meta
    tensor untouched: it holds no values, and torch runs such ops on the meta device through Python meta kernels,
    most of a large backbone's build time. Ops that change a tensor's shape or strides in place run."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _writes_values_only(func) and torch.is_tensor(args[0]) and args[0].device.type == "meta":
            return args[0]
        return func(*args, **(kwargs or {}))


def _writes_values_only(func) -> bool:
    schema = func._schema
    first = schema.arguments[0] if schema.arguments else None
    return (
        schema.name.endswith("_")
        and first is not None
        and first.alias_info is not None
        and first.alias_info.is_write
        and torch.Tag.inplace_view not in func.tags
        and schema.name not in ("aten::resize_", "aten::resize_as_", "aten::set_", "aten::detach_")
    )


def describe(cfg, model: torch.nn.Module | None = None, counted: dict | None = None) -> dict:
    """One row: counts of the backbone alone (no heads) at the global and the local crop size, each the multiple of
    the patch size nearest to 224 and 96 px (the row says which: global_px, local_px). `counted`: the forwards
    counted so far, by modules, pooling and size: backbones that differ only in their position embedding (learned,
    sin-cos, trainable or none: an addition, which counts no multiply-add) are counted once."""
    if model is None:
        cfg, model = build(cfg)
    counted = {} if counted is None else counted
    patch = cfg.patch_size or 1
    global_px, local_px = accepted_px(GLOBAL_PX, patch), accepted_px(96, patch)
    row = {"model": spec_of(cfg), "params_M": count_params(model) / 1e6}
    for label, size in (("global", global_px), ("local", local_px)):
        key = (structure(model, skip="pos_embed"), cfg.pooling, size)
        if key not in counted:
            macs, out = count_forward(model, size)
            counted[key] = macs, "x".join(str(int(n)) for n in out["grid"])
        macs, row[f"{label}_tokens"] = counted[key]
        row[f"{label}_px"] = size
        row[f"{label}_GMACs"] = macs / 1e9
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


def signature(cfg, model: torch.nn.Module) -> tuple:
    """What makes two backbones the same one: their modules, parameters and buffers (names and shapes), and the
    options that change only the forward. Options left at their default (model.patch_size None is the family's
    16) or spelt twice (vit_bn_large is vit_large with model.bn_mlp) give the same signature."""
    return structure(model), cfg.pooling, cfg.pos_embed, cfg.pos_embed_trainable


def recipe_models() -> list[tuple[str, object]]:
    """(recipe name, its model section) of every recipe. The section is the `base:` chain's model mappings merged
    over the schema's defaults, read from the YAML files alone (loading ~300 recipes takes ~80 ms each); a recipe
    whose model section the plain merge cannot give as the loader would (an interpolation, not a mapping) is
    loaded."""
    from scale.config.load import _load_chain

    fields = set(ModelConfig.__dataclass_fields__)
    out = []
    for path in list_recipes():
        sections = [raw.get("model", {}) for _, raw in _load_chain(path)]
        plain = all(isinstance(part, dict) for part in sections)
        merged = {key: value for part in sections if plain for key, value in part.items()}
        if not plain or "${" in str(merged) or not set(merged) <= fields:
            model = load_recipe(str(path)).model
        else:
            model = replace(ModelConfig(), **merged)
        out.append((recipe_name(path), model))
    return out


def table(specs: list[str] | None = None) -> Iterator[dict]:
    """Rows for `specs`, or one row per backbone of the paper models and of every recipe (with the recipes that
    use it), each yielded once counted: the backbones are built on the meta device first (to merge the spellings
    of one backbone), then counted one by one."""
    if specs:
        yield from (describe(parse_spec(s)) for s in specs)
        return
    configs: dict[tuple, tuple] = {}
    for spec in PAPER_MODELS:
        cfg = parse_spec(spec)
        configs[_key(cfg)] = (cfg, [])
    for name, cfg in recipe_models():
        configs.setdefault(_key(cfg), (cfg, []))[1].append(name)
    backbones: dict[tuple, tuple] = {}
    for cfg, names in configs.values():
        cfg, model = build(cfg)
        backbones.setdefault(signature(cfg, model), (cfg, model, []))[2].extend(names)
    counted: dict = {}
    for cfg, model, names in backbones.values():
        yield dict(describe(cfg, model, counted), recipes=sorted(names))
